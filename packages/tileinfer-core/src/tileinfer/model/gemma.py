"""Gemma 3's text models (``gemma3_text``: Gemma 3 270M and 1B) on the Llama-style decoder: what
differs from Llama, read from config.json, and where each difference is made.

- Every RMSNorm (the q/k norms too) computes in float32 and scales by ``1 + weight``, rounding
  once (``gemma_rmsnorm``: the backend's optional gemma_rmsnorm op, else torch ops; the rmsnorm
  ops round twice as Llama's does): the loader stores 1 + w in float32 (``weights.py``).
- A layer norms its attention output and its MLP output before they join the residual stream
  (``post_attention_layernorm``, ``post_feedforward_layernorm``) and the MLP's input with
  ``pre_feedforward_layernorm`` ("sandwich" norms, ``decoder.py``).
- The MLP is ``gelu_tanh(x W_gate) * (x W_up)``, then W_down (``decoder.py``).
- The embeddings are scaled by sqrt(hidden_size), rounded to the model's dtype first.
- Attention scores are scaled by ``query_pre_attn_scalar ** -0.5``; queries and keys are
  RMS-normed per head (as Qwen3's).
- Layers alternate: a ``sliding_attention`` layer sees the last ``sliding_window`` positions and
  rotates with the local RoPE base (``rope_local_base_freq``, 10,000); a ``full_attention``
  layer sees every position, with the global base (``rope_theta``, 1,000,000) and its scaling
  (linear for the larger models).

The multimodal checkpoints (``gemma3``: 4B, 12B, 27B) run as their text model: config.json's
``text_config`` (``text_config_of``, with the defaults transformers fills in for the fields it
leaves out), the tensors under ``language_model.`` (``weights.causal_lm_renames``); the vision
tower is not read, so images are not understood.

Both config.json forms are read: transformers 4's (``rope_theta``, ``rope_local_base_freq``,
``rope_scaling``, ``sliding_window_pattern``) and transformers 5's (``rope_parameters`` per layer
type, ``layer_types``). Soft-capping (Gemma 2's, and Gemma 3 configs that set it) and
bidirectional attention are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config_fields import ConfigError, float_field, int_field

SLIDING, FULL = "sliding_attention", "full_attention"
DEFAULT_PATTERN = 6  # every sixth layer full, as transformers when layer_types is absent


# Gemma3TextConfig's defaults (transformers 5.17) for the fields a multimodal checkpoint's
# text_config may leave out (google/gemma-3-4b-it's states only a few).
TEXT_DEFAULTS = dict(vocab_size=262_208, hidden_size=2304, intermediate_size=9216,
                     num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4,
                     head_dim=256, max_position_embeddings=131_072, rms_norm_eps=1e-6,
                     rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
                     query_pre_attn_scalar=256, sliding_window=4096)


def text_config_of(d: dict) -> dict:
    """The gemma3_text config.json of a multimodal ``gemma3`` one: its text_config, with
    transformers' defaults where it says nothing and the outer token ids and tying (any other
    config.json: itself)."""
    if d.get("model_type") != "gemma3" or not isinstance(d.get("text_config"), dict):
        return d
    text = {**TEXT_DEFAULTS, **d["text_config"], "model_type": "gemma3_text"}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings"):
        if name in d and name not in d["text_config"]:
            text[name] = d[name]
    return text


@dataclass(frozen=True)
class GemmaConfig:
    query_pre_attn_scalar: float
    layer_windows: tuple[int | None, ...]  # per layer: its sliding window, None when full
    local_rope_theta: float


def _rope_of(rope: dict, what: str) -> tuple[float, dict | None]:
    """(theta, None or {"rope_type": "linear", "factor"}) of one layer type's RoPE dict."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    theta = float_field(f"{what}.rope_theta", rope.get("rope_theta"))
    if kind == "default":
        return theta, None
    if kind == "linear":
        return theta, {"rope_type": "linear",
                       "factor": float_field(f"{what}.factor", rope.get("factor"))}
    raise ConfigError(f"config field '{what}.rope_type' is {kind!r}; Gemma 3 is supported with "
                      "'default' or 'linear' RoPE")


def gemma_config(d: dict, num_layers: int, sliding_window):
    """(GemmaConfig, the global RoPE theta, its scaling) of a gemma3_text config.json."""
    for name in ("final_logit_softcapping", "attn_logit_softcapping"):
        if d.get(name) is not None:
            raise ConfigError(f"config field {name!r} is {d[name]}: soft-capping is not "
                              "supported")
    if d.get("use_bidirectional_attention"):
        raise ConfigError("config field 'use_bidirectional_attention' is true: only causal "
                          "attention is supported")
    params = d.get("rope_parameters")
    if isinstance(params, dict) and FULL in params:  # transformers 5: one dict per layer type
        full = dict(params[FULL] or {})
        local = dict(params.get(SLIDING) or {})
        if d.get("rope_scaling"):
            full.update(d["rope_scaling"])
    else:
        full = dict(d.get("rope_scaling") or params or {})
        local = {}
        full.setdefault("rope_theta", d.get("rope_theta"))
        local["rope_theta"] = d.get("rope_local_base_freq")
    full.setdefault("rope_theta", None)
    if full["rope_theta"] is None:
        full["rope_theta"] = 1_000_000.0
    if local.get("rope_theta") is None:
        local["rope_theta"] = 10_000.0
    theta, scaling = _rope_of(full, "rope_parameters.full_attention")
    local_theta, local_scaling = _rope_of(local, "rope_parameters.sliding_attention")
    if local_scaling is not None:
        raise ConfigError("config field 'rope_parameters.sliding_attention' scales RoPE: only "
                          "the full-attention layers' RoPE may be scaled")
    types = d.get("layer_types")
    if types is None:
        pattern = int_field(d, "sliding_window_pattern",
                            d.get("sliding_window_pattern", DEFAULT_PATTERN))
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    if not isinstance(types, list) or len(types) != num_layers \
            or any(t not in (SLIDING, FULL) for t in types):
        raise ConfigError(f"config field 'layer_types' must name {SLIDING!r} or {FULL!r} for "
                          f"each of the {num_layers} layers, got {types!r}")
    window = int_field(d, "sliding_window", sliding_window) if SLIDING in types else None
    return GemmaConfig(
        query_pre_attn_scalar=float_field("query_pre_attn_scalar",
                                          d.get("query_pre_attn_scalar", 256)),
        layer_windows=tuple(window if t == SLIDING else None for t in types),
        local_rope_theta=local_theta), theta, scaling


# Batch-invariant models norm rows in blocks of exactly this many (the last one padded), so that
# every reduction has one shape whatever the step holds (a GPU reduction may order a row's sum by
# the number of rows; the ref backend's norms do the same).
INVARIANT_ROWS = 32


def _norm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight


def gemma_rmsnorm(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float,
                  invariant: bool = False, ops=None):
    """transformers' Gemma3RMSNorm: ``x * rsqrt(mean(x**2) + eps) * weight`` in float32 (weight:
    1 + w, float32), rounded once to out's dtype; over the last dimension, rows along the
    first (in blocks of INVARIANT_ROWS when invariant). out may be x. ops: a backend's op table,
    whose gemma_rmsnorm op (optional) runs it where the backend has one."""
    if ops is not None and ops.gemma_rmsnorm is not None:  # each row on its own (the contract)
        ops.gemma_rmsnorm(out, x, weight, eps)
        return
    if not invariant:  # torch's rms_norm: the same float32 math, one kernel on a GPU
        out.copy_(F.rms_norm(x.float(), (x.shape[-1],), weight, eps))
        return
    for start in range(0, x.shape[0], INVARIANT_ROWS):
        rows = x[start:start + INVARIANT_ROWS]
        block = rows.new_zeros((INVARIANT_ROWS, *rows.shape[1:]))
        block[:rows.shape[0]] = rows
        normed = _norm_rows(block, weight, eps)[:rows.shape[0]]
        out[start:start + rows.shape[0]] = normed.to(out.dtype)


def gemma_qk_norms(qkv: torch.Tensor, q_norm, k_norm, config, invariant: bool = False,
                   ops=None):
    """The per-head norms of the queries and keys in qkv (n, qkv_size), in place."""
    heads, kv_heads, eps = config.num_heads, config.num_kv_heads, config.rms_norm_eps
    per_head = qkv.view(qkv.shape[0], heads + 2 * kv_heads, config.head_dim)
    q, k = per_head[:, :heads], per_head[:, heads:heads + kv_heads]
    gemma_rmsnorm(q, q, q_norm, eps, invariant, ops)
    gemma_rmsnorm(k, k, k_norm, eps, invariant, ops)
