"""RoPE and the paged KV store of the ref backend: what ``attention_inputs`` does after the q/k
norms.

``rope`` and ``store_kv`` are not ops of the contract; ``attention_inputs`` uses them, and tests
(other backends' kernel tests, cache tests) call them to fill pages or compare with.
"""

from __future__ import annotations

import torch


def rope(x, cos, sin, positions):
    """x (n, heads, head_dim) rotated at positions (n,) with the "rotate half" pairing, in
    float32 (the caller rounds): ``x'[i] = x[i] c - x[i + h] s``, ``x'[i + h] = x[i + h] c + x[i] s``."""
    half = x.shape[-1] // 2
    c = cos[positions.long()][:, None, :]  # (n, 1, half)
    s = sin[positions.long()][:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def quantize_vectors(vec):
    """Per-vector symmetric INT8: vec (..., head_dim) float32 -> (int8 values, float32 scales),
    ``scale = max|vec| / 127`` (1 for an all-zero vector), values ``round(vec / scale)``."""
    amax = vec.abs().amax(-1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(vec / scale[..., None]), -127, 127).to(torch.int8)
    return q, scale


def _write_pages(cache, scale_pool, vec, slots):
    page_size = cache.shape[1]
    page, offset = slots // page_size, slots % page_size
    if scale_pool is None:
        cache[page, offset] = vec.to(cache.dtype)
    else:
        q, scale = quantize_vectors(vec.float())
        cache[page, offset] = q
        scale_pool[page, offset] = scale


def store_kv(kv, k, v, slots):
    """Write keys and values (n, kv_heads, head_dim) into the pages of kv (a ``LayerKV``) at
    slots (n,): copied into a float cache; into an INT8 cache quantized per vector, each key
    divided by kv.k_smooth first (if given)."""
    slots = slots.long()
    keys = k.float() / kv.k_smooth if kv.k_smooth is not None else k
    _write_pages(kv.k_cache, kv.k_scale, keys, slots)
    _write_pages(kv.v_cache, kv.v_scale, v, slots)
