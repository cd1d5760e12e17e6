"""The decoder: a forward step built from the op table's in-place ops on preallocated buffers.

Per layer (hidden states x of the step's n tokens, (n, hidden)):

    h = rmsnorm(x)                     (layer 0)  or  x += delta; h = rmsnorm(x)  (add_rmsnorm)
    qkv = h @ W_qkv.T                   (n, (heads + 2 kv_heads) head_dim)
    q = rope(qnorm(q)); cache <- rope(knorm(k)), v          (attention_inputs)
    a = attention(q, cache)             causal, grouped-query, over the paged cache
                                        (both in one op, attention_with_inputs, where the
                                        backend implements it itself)
    delta = a @ W_o.T
    x += delta; h = rmsnorm(x)          (add_rmsnorm)
    m = silu(h @ W_gate.T) * (h @ W_up.T)      (linear_swiglu; Apertus: xielu(h @ W_up.T))
    delta = m @ W_down.T

then the rows that get logits are gathered, ``x += delta`` and the final norm run on them only,
and ``logits = h @ W_lm_head.T`` is computed in the model dtype and converted to float32 (as
transformers rounds its logits to bf16 before ``.float()``, so that greedy ties break alike).

``Model.forward_step`` allocates nothing and never synchronizes with the host (no ``.item()``,
no ``.tolist()``): only op-table calls, views, and torch's out= forms of a row gather
(``index_select``) and copies (the float32 logits, ``hidden_out``), so a runner can capture it in
a CUDA graph with static ``StepMetadata`` and ``StepBuffers`` and replay it (whether the ops
themselves are capturable is the backend's ``graph_safe``; ref's attention reads the context
lengths on the host, so it is not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .backends import OpTable, get_backend
from .cache import ContextLengthError, PagedKVCache, Sequence
from .config import ModelConfig, check_max_len, load_config
from .quant import linear_operands
from .rope import rope_tables
from .step import StepMetadata, _as_ids, prepare_step
from .weights import ModelWeights, load_weights


@dataclass
class StepBuffers:
    """Preallocated activations of steps of n tokens with m logit rows (``Model.new_buffers``).

    hidden_out: layer index -> (n, hidden) tensor receiving that layer's output hidden states
    (the residual stream after the layer, transformers' ``hidden_states[layer + 1]``), for the
    layers asked for; a speculative drafter (DFlash) reads them.
    """

    hidden: torch.Tensor  # (n, hidden) residual stream
    normed: torch.Tensor  # (n, hidden) normalized input of the next projection
    qkv: torch.Tensor  # (n, qkv_size)
    q: torch.Tensor  # (n, heads, head_dim) queries after norm + RoPE
    attn: torch.Tensor  # (n, heads, head_dim) attention output
    delta: torch.Tensor  # (n, hidden) output of o_proj / down_proj, added to the residual
    act: torch.Tensor  # (n, intermediate) MLP activation
    gate_up: torch.Tensor | None  # (n, 2 * intermediate) scratch of linear_swiglu
    logit_hidden: torch.Tensor  # (m, hidden) gathered residual rows
    logit_delta: torch.Tensor  # (m, hidden) gathered last delta rows
    logit_normed: torch.Tensor  # (m, hidden)
    logits_model_dtype: torch.Tensor  # (m, vocab) in the model dtype
    logits: torch.Tensor  # (m, vocab) float32 (the same tensor when the model is float32)
    workspace: object  # the attention op's scratch, or None
    max_context_len: int  # the longest context the workspace is sized for
    hidden_out: dict[int, torch.Tensor] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return self.hidden.shape[0]

    @property
    def num_logits(self) -> int:
        return self.logits.shape[0]


class Model:
    """A loaded model: config, weights, the op table, RoPE tables, dtype, device, max_len."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, ops: OpTable,
                 dtype: torch.dtype, device, max_len: int, model_dir: Path | None = None,
                 quantize: str | None = None):
        self.config, self.weights, self.ops = config, weights, ops
        self.dtype, self.device, self.max_len = dtype, torch.device(device), max_len
        self.model_dir, self.quantize = model_dir, quantize
        self.cos, self.sin = rope_tables(config, max_len, dtype, self.device)
        # attention_inputs + attention as one op only where the backend has it itself: ref's
        # fallback would replace the backend's own two ops with ref's.
        self.fused_attention = "attention_with_inputs" not in ops.fallbacks

    @property
    def backend(self) -> str:
        return self.ops.name

    def __repr__(self):
        c = self.config
        return (f"Model({c.model_type}, layers={c.num_layers}, hidden={c.hidden_size}, "
                f"backend={self.backend!r}, dtype={self.dtype}, device={self.device}, "
                f"max_len={self.max_len}, quantize={self.quantize!r})")

    def new_cache(self, max_tokens: int | None = None, page_size: int = 16,
                  quantize: str | None = None, key_smoothing=None,
                  num_pages: int | None = None) -> PagedKVCache:
        """A cache in this model's dtype and device, with pages for max_tokens positions
        (default max_len) unless num_pages is given; sequences may grow to max_len."""
        if num_pages is None:
            num_pages = math.ceil((max_tokens or self.max_len) / page_size)
        return PagedKVCache(self.config, num_pages, page_size=page_size, dtype=self.dtype,
                            device=self.device, quantize=quantize, key_smoothing=key_smoothing,
                            max_seq_len=self.max_len)

    def check_cache(self, cache: PagedKVCache):
        if cache.config != self.config:
            raise ValueError("the KV cache was made for another model configuration")
        if cache.dtype != self.dtype or cache.device.type != self.device.type:
            raise ValueError(f"the KV cache holds {cache.dtype} on {cache.device}; the model runs "
                             f"{self.dtype} on {self.device}")

    def new_buffers(self, n_tokens: int, n_logits: int, hidden_layers=(),
                    max_context_len: int | None = None) -> StepBuffers:
        """Buffers for steps of n_tokens tokens and n_logits logit rows.

        hidden_layers: layers whose output hidden states the step writes to ``hidden_out``.
        max_context_len: the longest context the attention workspace must serve (default
        max_len, which covers every step ``prepare_step`` builds for this model).
        """
        c, dt, dev = self.config, self.dtype, self.device
        max_context_len = max_context_len or self.max_len

        def empty(*shape, dtype=dt):
            return torch.empty(shape, dtype=dtype, device=dev)

        logits_model_dtype = empty(n_logits, c.vocab_size)
        for layer in hidden_layers:
            if not 0 <= layer < c.num_layers:
                raise ValueError(f"hidden_layers: layer {layer} is not in 0..{c.num_layers - 1}")
        return StepBuffers(
            hidden=empty(n_tokens, c.hidden_size),
            normed=empty(n_tokens, c.hidden_size),
            qkv=empty(n_tokens, c.qkv_size),
            q=empty(n_tokens, c.num_heads, c.head_dim),
            attn=empty(n_tokens, c.num_heads, c.head_dim),
            delta=empty(n_tokens, c.hidden_size),
            act=empty(n_tokens, c.intermediate_size),
            gate_up=empty(n_tokens, 2 * c.intermediate_size) if c.mlp == "swiglu" else None,
            logit_hidden=empty(n_logits, c.hidden_size),
            logit_delta=empty(n_logits, c.hidden_size),
            logit_normed=empty(n_logits, c.hidden_size),
            logits_model_dtype=logits_model_dtype,
            logits=(logits_model_dtype if dt == torch.float32
                    else empty(n_logits, c.vocab_size, dtype=torch.float32)),
            workspace=self.ops.attention_workspace(n_tokens, c.num_heads, c.head_dim,
                                                   max_context_len, dev),
            max_context_len=max_context_len,
            hidden_out={layer: empty(n_tokens, c.hidden_size) for layer in hidden_layers},
        )

    def static_metadata(self, n_tokens: int, cache: PagedKVCache, n_logits: int = 1,
                        batch: int = 1) -> StepMetadata:
        """Static step metadata for steps of n_tokens tokens on cache, for CUDA graphs: fill it
        with ``prepare_step(..., max_len=model.max_len, out=meta)`` before each replay."""
        return StepMetadata.for_cache(cache, n_tokens, n_logits, batch, max_len=self.max_len)

    def forward_step(self, meta: StepMetadata, buffers: StepBuffers,
                     cache: PagedKVCache | None = None) -> torch.Tensor:
        """Run one step; returns ``buffers.logits`` (m, vocab) float32 for meta.logit_rows.

        cache: default meta.cache (the cache prepare_step built the step for). The cache must
        already hold pages for the step; the step writes the keys and values of its tokens at
        meta.slots. Graph-capturable: see the module docstring.
        """
        cache = cache if cache is not None else meta.cache
        if cache is None:
            raise ValueError("forward_step needs the KV cache (meta.cache is not set)")
        if (buffers.num_tokens, buffers.num_logits) != (meta.num_tokens, meta.num_logits):
            raise ValueError(f"buffers for {buffers.num_tokens} tokens / {buffers.num_logits} "
                             f"logit rows do not fit a step of {meta.num_tokens} / "
                             f"{meta.num_logits}")
        if meta.max_context_len > buffers.max_context_len:
            raise ValueError(f"the step's max_context_len {meta.max_context_len} exceeds the "
                             f"buffers' {buffers.max_context_len}")
        ops, c, w, b = self.ops, self.config, self.weights, buffers
        n, eps = meta.num_tokens, c.rms_norm_eps
        ops.embed(b.hidden, w.embed, meta.ids)
        for i, layer in enumerate(w.layers):
            if i == 0:
                ops.rmsnorm(b.normed, b.hidden, layer.attn_norm, eps)
            else:
                ops.add_rmsnorm(b.hidden, b.normed, b.delta, layer.attn_norm, eps)
                if i - 1 in b.hidden_out:  # b.hidden is now layer i - 1's output
                    b.hidden_out[i - 1].copy_(b.hidden)
            kv = cache.layer(i)
            ops.linear(b.qkv, b.normed, *linear_operands(layer.qkv))
            pools = (kv.k_cache, kv.v_cache, kv.k_scale, kv.v_scale, kv.k_smooth)
            inputs = (b.qkv, layer.q_norm, layer.k_norm, self.cos, self.sin, meta.positions,
                      meta.slots, eps)
            step = (meta.cu_seqlens_q, meta.context_lens, meta.block_table, meta.max_query_len,
                    meta.max_context_len, c.attention_scale, True, b.workspace)
            if self.fused_attention:
                ops.attention_with_inputs(b.attn, b.q, *pools, *inputs, *step)
            else:
                ops.attention_inputs(b.q, *pools, *inputs)
                ops.attention(b.attn, b.q, *pools, *step)
            ops.linear(b.delta, b.attn.view(n, c.q_size), *linear_operands(layer.o))
            ops.add_rmsnorm(b.hidden, b.normed, b.delta, layer.mlp_norm, eps)
            if layer.xielu is not None:
                x = layer.xielu
                ops.linear_xielu(b.act, b.normed, *linear_operands(layer.up), x.alpha_p,
                                 x.alpha_n, x.beta, x.eps)
            else:
                ops.linear_swiglu(b.act, b.normed, *linear_operands(layer.up), b.gate_up)
            ops.linear(b.delta, b.act, *linear_operands(layer.down))
        last = c.num_layers - 1
        if last in b.hidden_out:
            torch.add(b.hidden, b.delta, out=b.hidden_out[last])
        # Only the logit rows go through the last residual add, the final norm and the lm_head.
        # A step with a logit row per token (decode, verify) has them all, in order: no gather.
        if meta.num_logits == n:
            hidden, delta = b.hidden, b.delta
        else:
            hidden, delta = b.logit_hidden, b.logit_delta
            torch.index_select(b.hidden, 0, meta.logit_rows, out=hidden)
            torch.index_select(b.delta, 0, meta.logit_rows, out=delta)
        ops.add_rmsnorm(hidden, b.logit_normed, delta, w.norm, eps)
        head, head_scale = linear_operands(w.lm_head)
        if head_scale is None:
            # A float head's product is rounded to the model dtype even when the op writes
            # float32 (the linear contract), so it writes the float32 logits directly.
            ops.linear(b.logits, b.logit_normed, head, None)
        else:
            ops.linear(b.logits_model_dtype, b.logit_normed, head, head_scale)
            if b.logits is not b.logits_model_dtype:
                b.logits.copy_(b.logits_model_dtype)
        return b.logits


def forward_batch(model: Model, cache: PagedKVCache, seqs: list[Sequence], token_lists,
                  all_logits: bool = False) -> torch.Tensor:
    """One eager step over several sequences: logits (m, vocab) float32, rows in sequence order
    (each sequence's last token, or every token with all_logits). Appends the ids to each
    sequence. On error no sequence changes (pages reserved for the step are given back)."""
    model.check_cache(cache)
    token_lists = [_as_ids(ids) for ids in token_lists]
    lengths = [len(seq) for seq in seqs]
    meta = prepare_step(cache, seqs, token_lists, all_logits=all_logits, max_len=model.max_len)
    try:
        buffers = model.new_buffers(meta.num_tokens, meta.num_logits)
        logits = model.forward_step(meta, buffers, cache)
    except BaseException:
        for seq, n in zip(seqs, lengths):
            cache.truncate(seq, n)
        raise
    for seq, ids in zip(seqs, token_lists):
        seq.tokens.extend(ids)
    return logits


def forward(model: Model, cache: PagedKVCache, seq: Sequence, ids,
            all_logits: bool = False) -> torch.Tensor:
    """Run the token ids at the positions after those cached in seq; store their keys and
    values in cache and append them to seq. Returns float32 logits: (1, vocab) for the last
    token, or (len(ids), vocab) with all_logits. Runs eagerly with buffers made for this step.

    A step that would take seq past max_length(model) (ContextLengthError) or need more pages
    than are free (OutOfPagesError) raises before anything changes.
    """
    return forward_batch(model, cache, [seq], [ids], all_logits=all_logits)


def max_length(model: Model) -> int:
    """The longest sequence model can process: the positions its RoPE tables cover."""
    return model.max_len


def resolve_model_dir(model) -> Path:
    """A model directory as given, or the directory of a pulled repo id (``tileinfer.hub``)."""
    path = Path(model)
    if path.is_dir():
        return path
    try:
        from .hub import model_dir
    except ImportError:
        raise FileNotFoundError(f"{model!r} is not a model directory (and tileinfer.hub, which "
                                "resolves pulled repo ids, is not available)") from None
    return Path(model_dir(model))


def _default_device(ops: OpTable):
    devices = ops.backend.info.devices
    if "cuda" in devices and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device(devices[0] if devices else "cpu")


def load_model(model, dtype: torch.dtype = torch.bfloat16, backend="ref", device=None,
               max_len: int = 4096, quantize: str | None = None) -> Model:
    """Load a model directory (or a pulled repo id) to run on backend.

    dtype: the activation and weight dtype. device: default cuda when the backend runs there
    and a GPU is present, else the CPU. max_len: the longest sequence (positions the RoPE tables
    cover). quantize: None, or "int8" for INT8 weight-only linear layers (``quant``).
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    ops = get_backend(backend)
    device = torch.device(device) if device is not None else _default_device(ops)
    if device.type not in ops.backend.info.devices:
        raise ValueError(f"backend {ops.name!r} runs on {', '.join(ops.backend.info.devices)}, "
                         f"not {device.type}")
    model_dir = resolve_model_dir(model)
    config = load_config(model_dir)
    check_max_len(config, max_len)
    weights = load_weights(config, model_dir, dtype=dtype, device=device, quantize=quantize)
    return Model(config, weights, ops, dtype, device, max_len, model_dir=model_dir,
                 quantize=quantize)


__all__ = ["ContextLengthError", "Model", "StepBuffers", "forward", "forward_batch",
           "load_model", "max_length", "resolve_model_dir"]
