"""config.json of an imported GGUF file, from its metadata: the architectures the import reads,
their sizes, RoPE and its scaling (linear; YaRN; Llama 3's, from the divisors llama.cpp stores),
the attention window, and the special token ids."""

from __future__ import annotations

import math

import numpy as np
import torch

from .gguf_reader import GGUFImportError, GGUFMetadata

# general.architecture -> (config.json's model_type, its architectures entry)
ARCHITECTURES = {"llama": ("llama", "LlamaForCausalLM"), "qwen2": ("qwen2", "Qwen2ForCausalLM"),
                 "qwen3": ("qwen3", "Qwen3ForCausalLM"), "phi3": ("phi3", "Phi3ForCausalLM"),
                 "gemma3": ("gemma3_text", "Gemma3ForCausalLM")}
# What llama.cpp sets for gemma3 without reading it from the file (llama-model.cpp): every sixth
# layer global, the local layers' RoPE base, and (but for the 27B model, of 62 layers) queries
# scaled by head_dim ** -0.5.
GEMMA3_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0
GEMMA3_27B_LAYERS = 62


def llama3_rope_factors(head_dim, theta, factor, low_freq_factor, high_freq_factor, original_max_positions):
    """The per-frequency divisors llama.cpp stores as rope_freqs.weight for llama3 RoPE scaling
    (convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors)."""
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    low_freq_wavelen = original_max_positions / low_freq_factor
    high_freq_wavelen = original_max_positions / high_freq_factor
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            out.append(1.0)
        elif wavelen > low_freq_wavelen:
            out.append(factor)
        else:
            smooth = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)


def _rope_scaling(meta: GGUFMetadata, arch: str, head_dim: int, theta: float, rope_freqs: np.ndarray | None):
    kind = meta.get(f"{arch}.rope.scaling.type")
    if rope_freqs is not None:
        # llama3 scaling leaves only the divisors in the file. Llama 3.1-3.3 all use low/high
        # frequency factors 1 and 4 over 8192 original positions; take the factor from the divisors
        # and accept only if the recomputed divisors match the file's.
        params = {
            "factor": float(rope_freqs.max()),
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
        expected = llama3_rope_factors(head_dim, theta, *params.values())
        if expected.shape != rope_freqs.shape or not np.allclose(expected, rope_freqs, rtol=1e-3):
            raise GGUFImportError(
                f"{meta.path}: rope_freqs.weight holds RoPE scaling factors that are not Llama 3's "
                "(low/high frequency factors 1 and 4 over 8192 positions); not supported"
            )
        return {"rope_type": "llama3", **params}
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(meta.require(f"{arch}.rope.scaling.factor"))}
    if kind == "yarn":
        return _yarn_scaling(meta, arch)
    raise GGUFImportError(f"{meta.path}: RoPE scaling {kind!r} is not supported (only none, "
                          "linear, llama3 and yarn)")


# YaRN keys without a verified transformers equivalent: llama.cpp derives YaRN's attention
# factor itself (from factor, or from yarn_log_multiplier) and scales it by attn_factor, which
# is not how transformers reads an attention_factor, and yarn_ext_factor weighs the
# extrapolated frequencies, which transformers has no field for. A file with any is refused.
_YARN_UNMAPPED = ("attn_factor", "yarn_attn_factor", "yarn_ext_factor", "yarn_log_multiplier")


def _yarn_scaling(meta: GGUFMetadata, arch: str) -> dict:
    """The transformers yarn dict of the file's YaRN keys, as llama.cpp's converter wrote them
    from config.json: factor, original_context_length (original_max_position_embeddings;
    llama.cpp, as transformers, takes the context length where it is absent), yarn_beta_fast
    and yarn_beta_slow (beta_fast, beta_slow; absent: 32 and 1 in both). llama.cpp always
    rounds the correction range outwards: transformers' truncate, its default."""
    prefix = f"{arch}.rope.scaling."
    if arch not in ("llama", "qwen2", "qwen3"):
        raise GGUFImportError(f"{meta.path}: yarn RoPE scaling is supported in llama, qwen2 and "
                              f"qwen3 files, not {arch}")
    for key in _YARN_UNMAPPED:
        if meta.get(prefix + key) is not None:
            raise GGUFImportError(f"{meta.path}: the metadata key {prefix + key} is not supported "
                                  "(llama.cpp's meaning of it has no transformers equivalent)")
    original = meta.get(prefix + "original_context_length",
                        meta.require(f"{arch}.context_length"))
    scaling = {"rope_type": "yarn", "factor": float(meta.require(prefix + "factor")),
               "original_max_position_embeddings": int(original)}
    for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
        value = meta.get(prefix + key)
        if value is not None:
            scaling[name] = float(value)
    return scaling


def _attention_fields(meta: GGUFMetadata, arch: str) -> dict:
    """config.json's bias and attention window fields, as each architecture's config names them."""
    if arch == "qwen2":  # its projections always have q/k/v biases: transformers reads no field
        return {"use_sliding_window": False}
    if arch == "phi3":  # Phi-3-mini-4k attends to its last 2047 positions (llama.cpp as well)
        window = int(meta.get(f"{arch}.attention.sliding_window", 0))
        return {"sliding_window": window or None}
    if arch == "gemma3":
        return _gemma3_fields(meta)
    return {"attention_bias": False, "mlp_bias": False}


def _gemma3_fields(meta: GGUFMetadata) -> dict:
    """Gemma 3's fields as llama.cpp runs the file (see GEMMA3_PATTERN)."""
    hidden = int(meta.require("gemma3.embedding_length"))
    heads = int(meta.require("gemma3.attention.head_count"))
    head_dim = int(meta.get("gemma3.attention.key_length", hidden // heads))
    layers = int(meta.require("gemma3.block_count"))
    scalar = hidden // heads if layers == GEMMA3_27B_LAYERS else head_dim
    return {"sliding_window": int(meta.require("gemma3.attention.sliding_window")),
            "sliding_window_pattern": GEMMA3_PATTERN,
            "rope_local_base_freq": GEMMA3_LOCAL_ROPE_BASE, "query_pre_attn_scalar": scalar,
            "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
            "attn_logit_softcapping": None, "attention_bias": False}


def config_from(meta: GGUFMetadata, arch: str, vocab_size: int, tied: bool, rope_freqs, dtype: torch.dtype) -> dict:
    hidden = int(meta.require(f"{arch}.embedding_length"))
    heads = int(meta.require(f"{arch}.attention.head_count"))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    rotary_dim = int(meta.get(f"{arch}.rope.dimension_count", head_dim))
    if rotary_dim != head_dim:
        raise GGUFImportError(f"{meta.path}: partial RoPE ({rotary_dim} of {head_dim} dims) is not supported")
    theta = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
    model_type, architecture = ARCHITECTURES[arch]
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": int(meta.require(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(meta.require(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": int(meta.require(f"{arch}.context_length")),
        "rms_norm_eps": float(meta.require(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(meta, arch, head_dim, theta, rope_freqs),
        **_attention_fields(meta, arch),
        "tie_word_embeddings": tied,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if arch == "gemma3":  # its activation is _gemma3_fields' hidden_activation
        del config["hidden_act"]
    # None where the file names none: Phi3Config's default padding id (32000) is outside the
    # vocabulary of a file of another vocabulary.
    config["pad_token_id"] = None
    for name in ("bos", "eos", "padding"):
        token_id = meta.get(f"tokenizer.ggml.{name}_token_id")
        if token_id is not None:
            config[f"{'pad' if name == 'padding' else name}_token_id"] = int(token_id)
    return config
