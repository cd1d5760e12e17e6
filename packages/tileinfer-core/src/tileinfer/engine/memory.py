"""Memory reporting: bytes of a model's weights and of its KV cache per token, and how many
tokens of KV cache fit in a memory budget.

Everything here is measured from the tensors themselves (``numel * element_size`` of each weight
and cache pool), not computed from the config, so it reports what a load or a cache really took.

Two weight figures, because they differ for a model with tied embeddings:

- ``weight_bytes``: what the weights occupy (every distinct tensor once). An INT8 model keeps its
  embedding table in the model dtype and, when the LM head is tied to it, adds an INT8 copy for
  the head, so a tied model does not halve here.
- ``decode_weight_bytes``: what one decode step at batch 1 reads: every weight except the
  embedding table, of which one row. INT8 halves this (plus one float32 scale per output row),
  tied or not: it is what bounds decode speed.

KV: ``kv_bytes_per_token`` is the cache bytes one position takes over all layers, keys and
values (``2 * layers * kv_heads * head_dim * 2`` in bf16; ``2 * layers * kv_heads * (head_dim + 4)``
in INT8: int8 values and one float32 scale per vector), so INT8 holds ``2 * head_dim /
(head_dim + 4)`` times as many tokens in the same memory (1.88x at head_dim 64, 1.94x at 128).
Key smoothing factors are a fixed ``layers * kv_heads * head_dim`` float32 on top.
"""

from __future__ import annotations

import torch

from ..model.quant import QuantizedWeight
from ..model.weights import weight_bytes
from .kv.cache import PagedKVCache
from .runtime.runtime import existing_runtime

DEFAULT_BUDGET = 1 << 30  # 1 GiB


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}.get(
        dtype, str(dtype).split(".")[-1])


def decode_weight_bytes(model) -> int:
    """Bytes of weights one decode step reads at batch 1: all but the embedding table (one row
    of it). An LM head tied to the embedding is read whole, as the head."""
    w = model.weights
    embed = _nbytes(w.embed)
    row = embed // w.embed.shape[0]
    return weight_bytes(model) - (0 if w.lm_head is w.embed else embed) + row


def linear_weight_bytes(model) -> int:
    """Bytes of the linear layers (qkv, o, gate/up, down, LM head), INT8 / FP8 scales included:
    the weights that ``quantize`` stores in one byte an element."""
    w = model.weights
    items = [w.lm_head] + [x for layer in w.layers for x in (layer.qkv, layer.o, layer.up,
                                                               layer.down)]
    return sum(_nbytes(x.q) + _nbytes(x.scale) if isinstance(x, QuantizedWeight) else _nbytes(x)
               for x in items)


def cache_bytes(cache: PagedKVCache) -> int:
    """Bytes the cache's tensors take: page pools, INT8 scales, key smoothing factors."""
    return sum(_nbytes(t) for t in (cache.k_pages, cache.v_pages, cache.k_scales,
                                    cache.v_scales, cache.k_smooth))


def kv_precision(cache: PagedKVCache) -> str:
    """'bf16' / 'fp32' / ... for a cache in the activation dtype, 'int8' or 'int8-smooth'."""
    if cache.quantize == "int8":
        return "int8-smooth" if cache.k_smooth is not None else "int8"
    return _dtype_name(cache.dtype)


def memory_report(model, cache: PagedKVCache | None = None, budget_bytes: int | None = None,
                  kv_quantize: str | None = None, key_smoothing: bool = False,
                  page_size: int | None = None) -> dict:
    """Bytes of the weights and of the KV cache per token, and the KV capacity of a budget.

    model: a loaded ``Model``. cache: a ``PagedKVCache`` whose precision, page size and pools
    are measured; without one, a one-page cache of ``kv_quantize`` (None: the model dtype, or
    "int8", with ``key_smoothing`` factors if asked) is made on the CPU and measured.
    budget_bytes: the memory given to the KV cache (default 1 GiB); ``kv_capacity_tokens`` is
    what it holds in whole pages after the fixed smoothing factors.

    Returns a dict of plain numbers and strings (JSON-ready):
    weights, weight_bytes, decode_weight_bytes, linear_weight_bytes, kv_cache, page_size,
    kv_bytes_per_token, kv_fixed_bytes, kv_budget_bytes, kv_capacity_tokens, with a cache
    also cache_bytes and cache_tokens, and ``runtime``: what the model's runtime holds now
    (``ModelRuntime.memory``: its KV pool, static step buffers and CUDA graphs; zeros before
    the model first runs).
    """
    if cache is None:
        c = model.config
        smoothing = ([torch.ones(c.num_kv_heads, c.head_dim)] * c.num_layers
                     if key_smoothing else None)
        probe = PagedKVCache(c, 1, page_size=page_size or 16, dtype=model.dtype, device="cpu",
                             quantize=kv_quantize, key_smoothing=smoothing)
    else:
        if kv_quantize is not None or key_smoothing or page_size is not None:
            raise ValueError("kv_quantize, key_smoothing and page_size describe a cache to "
                             "measure; pass them without a cache")
        probe = cache
    fixed = _nbytes(probe.k_smooth)
    positions = probe.num_pages * probe.page_size
    per_token = (cache_bytes(probe) - fixed) // positions
    page_bytes = per_token * probe.page_size
    budget = DEFAULT_BUDGET if budget_bytes is None else int(budget_bytes)
    pages = max(0, budget - fixed) // page_bytes
    report = dict(weights=model.quantize or _dtype_name(model.dtype),
                  weight_bytes=weight_bytes(model),
                  decode_weight_bytes=decode_weight_bytes(model),
                  linear_weight_bytes=linear_weight_bytes(model),
                  kv_cache=kv_precision(probe), page_size=probe.page_size,
                  kv_bytes_per_token=per_token, kv_fixed_bytes=fixed,
                  kv_budget_bytes=budget, kv_capacity_tokens=pages * probe.page_size)
    if cache is not None:
        report.update(cache_bytes=cache_bytes(cache), cache_tokens=positions)
    runtime = existing_runtime(model)
    report["runtime"] = runtime.memory() if runtime is not None else dict(
        kv_pool_bytes=0, kv_pool_pages=0, kv_pages_live=0, static_step_bytes=0, static_steps=0,
        cuda_graphs=0)
    return report


def format_bytes(n: int) -> str:
    """1234567 -> '1.23 MB' (decimal units)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"
