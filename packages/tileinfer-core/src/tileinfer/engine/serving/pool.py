"""Sizing the serving engine's KV page pool.

On a GPU the pool takes what is left of a fraction of the device's memory (0.9 by default, like
other engines' ``gpu_memory_utilization``) once the weights and everything else already
allocated are counted (``torch.cuda.mem_get_info``), minus an estimate of the activations the
engine's steps need (the eager buffers of the largest step, the static buffers of every
CUDA-graph bucket, and a margin for the attention workspace and allocator slack). Call it after
the model is loaded and before anything else large is allocated. On the CPU there is no such
budget: the pool holds a given number of tokens.
"""

from __future__ import annotations

import math

import torch

from ..kv.cache import check_pool_args, kv_bytes_per_token
from ..runtime.static_steps import MAX_KEPT
from .batch_runner import bucket_sizes
from .mixed_steps import MIXED_MAX_TOKENS

DEFAULT_CPU_TOKENS = 32768
MARGIN_BYTES = 512 << 20  # attention workspaces, allocator slack, sampling scratch


def step_activation_bytes(model, num_tokens: int, num_logits: int) -> int:
    """Bytes of ``Model.new_buffers(num_tokens, num_logits)`` without the attention workspace."""
    c = model.config
    item = torch.empty((), dtype=model.dtype).element_size()
    per_token = (3 * c.hidden_size + c.qkv_size + 2 * c.num_heads * c.head_dim
                 + 3 * c.intermediate_size)
    per_logit = 3 * c.hidden_size + c.vocab_size
    logits32 = 0 if model.dtype == torch.float32 else 4 * num_logits * c.vocab_size
    return item * (num_tokens * per_token + num_logits * per_logit) + logits32


def activation_reserve(model, max_step_tokens: int, max_batch: int, graphs: bool,
                       static_mixed: bool = False) -> int:
    """What the engine's steps may allocate besides the pool: the largest eager step (twice,
    for the allocator's transient copies), every graph bucket's static buffers, the kept
    static mixed-step shapes' buffers (``static_mixed``), a margin."""
    eager = 2 * step_activation_bytes(model, max_step_tokens, min(max_batch, max_step_tokens))
    static = sum(step_activation_bytes(model, b, b) for b in bucket_sizes(max_batch)) \
        if graphs else 0
    mixed = MAX_KEPT * step_activation_bytes(model, MIXED_MAX_TOKENS, max_batch) \
        if static_mixed else 0
    return eager + static + mixed + MARGIN_BYTES


def kv_pool_pages(model, fraction: float = 0.9, page_size: int = 16,
                  quantize: str | None = None, cpu_tokens: int | None = None,
                  max_step_tokens: int = 2048, max_batch: int = 64,
                  graphs: bool | None = None, static_mixed: bool | None = None,
                  reclaimable: int = 0) -> int:
    """How many KV pages of page_size positions the engine's pool gets.

    CUDA: ``fraction * total - (total - free) - activation_reserve(...)`` bytes of pages, with
    (free, total) from ``torch.cuda.mem_get_info``; ValueError when that leaves no page.
    ``reclaimable``: bytes in use now that the pool replaces (the model runtime's idle pool).
    CPU: pages for ``cpu_tokens`` positions (default 32,768).
    """
    check_pool_args(model.config, None, page_size, quantize)
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    device = torch.device(model.device)
    if device.type != "cuda":
        tokens = DEFAULT_CPU_TOKENS if cpu_tokens is None else int(cpu_tokens)
        if tokens < 1:
            raise ValueError(f"cpu_tokens must be >= 1, got {tokens}")
        return math.ceil(tokens / page_size)
    if graphs is None:
        graphs = model.ops.graph_safe
    if static_mixed is None:  # BatchRunner's default
        static_mixed = graphs
    free, total = torch.cuda.mem_get_info(device)
    page_bytes = kv_bytes_per_token(model.config, quantize, model.dtype) * page_size
    budget = fraction * total - (total - free - reclaimable) - activation_reserve(
        model, max_step_tokens, max_batch, graphs, static_mixed)
    pages = int(budget // page_bytes)
    if pages < 1:
        raise ValueError(
            f"no memory left for the KV cache: {fraction:.0%} of {total / 2**30:.1f} GiB minus "
            f"{(total - free) / 2**30:.1f} GiB in use and the activations' reserve leaves "
            f"{budget / 2**30:.2f} GiB; raise fraction or lower max_step_tokens / max_batch")
    return pages


def engine_pool(runtime, num_pages, page_size, kv_quantize, key_smoothing, **sizing):
    """The runtime's pool made or grown for an engine: ``num_pages`` request pages exactly, or
    (None) ``kv_pool_pages(model, **sizing)`` of them, counting an idle pool that nothing keeps
    as memory it replaces; plus the runtime's scratch page. Call it under ``runtime.lock``."""
    if num_pages is not None:
        return runtime.kv_pool(num_pages + 1, page_size, kv_quantize, key_smoothing, exact=True)
    cache = runtime.cache
    idle = cache is not None and not runtime.live_pages() and not runtime.open_engines()
    num_pages = kv_pool_pages(runtime.model, page_size=page_size, quantize=kv_quantize,
                              reclaimable=cache.nbytes if idle else 0, **sizing)
    return runtime.kv_pool(num_pages + 1, page_size, kv_quantize, key_smoothing)
