"""kv.cu: the attention inputs, everything between the qkv projection and attention (per-head
q/k RMSNorm, RoPE, the queries written out, the new keys and values stored into the paged cache,
INT8-quantized for an INT8 cache), one warp per head vector. The file's store_kv kernel (keys and
values without the rest) is not launched."""

from __future__ import annotations

import torch

from .common import DTYPE_NAMES, aligned, cdiv, contig, dev, fallback, kernel
from .tuning import pdl


def cache_defines(k_cache, act_dtype, head_dim) -> dict:
    int8 = k_cache.dtype == torch.int8
    defines = {"DTYPE": DTYPE_NAMES[act_dtype], "HEAD_DIM": head_dim, "CACHE_INT8": int(int8)}
    if not int8:
        defines["CACHE_DTYPE"] = DTYPE_NAMES[k_cache.dtype]
    return defines


def cache_ok(kv, head_dim) -> bool:
    """Pages the kernels read and write: float pages of a kernel dtype, or int8 pages with
    float32 scales (and float32 key smoothing, if any)."""
    k_cache, v_cache = kv.k_cache, kv.v_cache
    int8 = k_cache.dtype == torch.int8
    return (k_cache.dtype == v_cache.dtype and (int8 or k_cache.dtype in DTYPE_NAMES)
            and k_cache.shape == v_cache.shape and k_cache.shape[-1] == head_dim
            and contig(k_cache, v_cache, kv.k_scale, kv.v_scale, kv.k_smooth)
            and (not int8 or (kv.k_scale is not None and kv.v_scale is not None
                              and kv.k_scale.dtype == kv.v_scale.dtype == torch.float32))
            and (kv.k_smooth is None or kv.k_smooth.dtype == torch.float32)
            and aligned(k_cache, v_cache) and head_dim % 2 == 0 and head_dim <= 256)


def inputs_ok(q_out, kv, qkv, qk, step) -> bool:
    """What kv.cu's attention_inputs (and the fused decode attention) takes."""
    n, heads, head_dim = q_out.shape
    kv_heads = kv.k_cache.shape[2]
    norm = qk.q_norm if qk.q_norm is not None else qk.k_norm
    return (qkv.dtype in DTYPE_NAMES and q_out.dtype in DTYPE_NAMES
            and contig(qkv, q_out, qk.q_norm, qk.k_norm)
            and qkv.shape == (n, (heads + 2 * kv_heads) * head_dim) and aligned(qkv, q_out)
            and (qk.q_norm is None or qk.k_norm is None or qk.q_norm.dtype == qk.k_norm.dtype)
            and (norm is None or norm.dtype in DTYPE_NAMES)
            and contig(qk.cos, qk.sin, step.positions, step.slots)
            and qk.cos.dtype == qk.sin.dtype == torch.float32
            and step.positions.dtype == torch.int32 and step.slots.dtype == torch.int64
            and cache_ok(kv, head_dim))


def attention_inputs(q_out, kv, qkv, qk, step):
    if not inputs_ok(q_out, kv, qkv, qk, step):
        return fallback("attention_inputs", "layout", q_out, kv, qkv, qk, step)
    n, heads, head_dim = q_out.shape
    if n == 0:
        return
    kv_heads = kv.k_cache.shape[2]
    norm = qk.q_norm if qk.q_norm is not None else qk.k_norm
    defines = cache_defines(kv.k_cache, qkv.dtype, head_dim)
    defines["QOUT_DTYPE"] = DTYPE_NAMES[q_out.dtype]
    if norm is not None:
        defines["NORM_DTYPE"] = DTYPE_NAMES[norm.dtype]
    device = dev(qkv)
    k = kernel("kv.cu", "attention_inputs", "p" * 13 + "iiiif", device, defines)
    warps = n * (heads + 2 * kv_heads)
    k.launch((cdiv(warps, 4),), (128,),
             (q_out, kv.k_cache, kv.v_cache, kv.k_scale, kv.v_scale, kv.k_smooth, qkv, qk.q_norm,
              qk.k_norm, qk.cos, qk.sin, step.positions, step.slots, n, heads, kv_heads,
              kv.k_cache.shape[1], qk.norm_eps), pdl=pdl(device))
