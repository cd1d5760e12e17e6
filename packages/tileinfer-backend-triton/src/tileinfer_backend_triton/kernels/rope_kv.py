"""The ``attention_inputs`` op (per-head q/k RMSNorm + RoPE + k/v written into the pages, bf16 or
INT8 per vector with key smoothing), and standalone RoPE and KV-store kernels (behind no op of
the contract; their launchers remain for code that needs them alone and are tested against the
ref backend).

One program per token handles all of its heads: every vector is held as its two halves
[heads, head_dim / 2], which is what the "rotate half" RoPE pairing of Llama/Qwen needs
(``out[i] = x[i] c - x[i + h] s``, ``out[i + h] = x[i + h] c + x[i] s``). The fused op reads the
token's qkv row once and writes the rotated queries and the cached keys/values in one launch.

INT8 pages (SmoothQuant-style keys): a key is first divided by its per-channel smoothing factors,
then every vector gets ``scale = max|v| / 127`` (1 for an all-zero vector) and
``round_half_even(v / scale)`` clamped to [-127, 127], exactly as the ref backend.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import cast_to, next_pow2, pdl_args, pdl_launch_dependents, pdl_wait, round_half_even


@triton.jit
def _rms_halves(x1, x2, w_ptr, i, HALF, HD, eps, x_ty: tl.constexpr):
    """Per-row RMSNorm of [R, HALF_PAD] halves (LlamaRMSNorm's two roundings, to x_ty)."""
    ms = tl.math.div_rn(tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1), HD * 1.0)
    r = tl.rsqrt(ms + eps)[:, None]
    h1 = cast_to(x1 * r, x_ty).to(tl.float32)
    h2 = cast_to(x2 * r, x_ty).to(tl.float32)
    imask = i < HALF
    w1 = cast_to(tl.load(w_ptr + i, mask=imask, other=0.0), x_ty).to(tl.float32)
    w2 = cast_to(tl.load(w_ptr + HALF + i, mask=imask, other=0.0), x_ty).to(tl.float32)
    return (cast_to(w1[None, :] * h1, x_ty).to(tl.float32),
            cast_to(w2[None, :] * h2, x_ty).to(tl.float32))


@triton.jit
def _rope_halves(x1, x2, cos_ptr, sin_ptr, s_cs, pos, i, HALF):
    imask = i < HALF
    c = tl.load(cos_ptr + pos * s_cs + i, mask=imask, other=0.0)[None, :]
    s = tl.load(sin_ptr + pos * s_cs + i, mask=imask, other=0.0)[None, :]
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def _store_vectors(cache_ptr, scale_ptr, slot_off, scale_off, heads, s_ch, s_sh, i, HALF,
                   v1, v2, mask, INT8: tl.constexpr):
    """Write vectors given as float32 halves [R, HALF_PAD] at one cache slot.

    slot_off: element offset of the slot in the page pool; heads: [R] kv head indices."""
    base = cache_ptr + slot_off + heads.to(tl.int64)[:, None] * s_ch + i[None, :]
    if INT8:
        amax = tl.maximum(tl.max(tl.abs(v1), axis=1), tl.max(tl.abs(v2), axis=1))
        scale = tl.where(amax > 0, tl.math.div_rn(amax, 127.0), 1.0)
        q1 = tl.math.div_rn(v1, scale[:, None])
        q2 = tl.math.div_rn(v2, scale[:, None])
        q1 = tl.minimum(tl.maximum(round_half_even(q1), -127.0), 127.0)
        q2 = tl.minimum(tl.maximum(round_half_even(q2), -127.0), 127.0)
        tl.store(base, q1.to(tl.int8), mask=mask)
        tl.store(base + HALF, q2.to(tl.int8), mask=mask)
        tl.store(scale_ptr + scale_off + heads * s_sh, scale, mask=tl.max(mask, axis=1) > 0)
    else:
        ty = cache_ptr.dtype.element_ty
        tl.store(base, cast_to(v1, ty), mask=mask)
        tl.store(base + HALF, cast_to(v2, ty), mask=mask)


@triton.jit
def _slot_offsets(slots_ptr, t, PAGE, s_cp, s_cs, s_sp, s_ss):
    slot = tl.load(slots_ptr + t).to(tl.int64)
    page = slot // PAGE
    off = slot % PAGE
    return page * s_cp + off * s_cs, page * s_sp + off * s_ss


@triton.jit
def _rope_kernel(out_ptr, x_ptr, cos_ptr, sin_ptr, pos_ptr, H, HALF, s_xt, s_xh, s_ot, s_oh, s_cs,
                 H_PAD: tl.constexpr, HALF_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, H_PAD)
    i = tl.arange(0, HALF_PAD)
    mask = (h < H)[:, None] & (i < HALF)[None, :]
    pos = tl.load(pos_ptr + t).to(tl.int64)
    xp = x_ptr + t * s_xt + h[:, None] * s_xh + i[None, :]
    x1 = tl.load(xp, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(xp + HALF, mask=mask, other=0.0).to(tl.float32)
    y1, y2 = _rope_halves(x1, x2, cos_ptr, sin_ptr, s_cs, pos, i, HALF)
    op = out_ptr + t * s_ot + h[:, None] * s_oh + i[None, :]
    ty = out_ptr.dtype.element_ty
    tl.store(op, cast_to(y1, ty), mask=mask)
    tl.store(op + HALF, cast_to(y2, ty), mask=mask)


@triton.jit
def _store_kv_kernel(k_cache, v_cache, k_scale, v_scale, k_smooth, k_ptr, v_ptr, slots_ptr,
                     KVH, HALF, PAGE, s_kt, s_kh, s_vt, s_vh,
                     s_cp, s_cs, s_ch, s_sp, s_ss, s_sh,
                     INT8: tl.constexpr, SMOOTH: tl.constexpr,
                     KVH_PAD: tl.constexpr, HALF_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, KVH_PAD)
    i = tl.arange(0, HALF_PAD)
    mask = (h < KVH)[:, None] & (i < HALF)[None, :]
    slot_off, scale_off = _slot_offsets(slots_ptr, t, PAGE, s_cp, s_cs, s_sp, s_ss)
    kp = k_ptr + t * s_kt + h[:, None] * s_kh + i[None, :]
    k1 = tl.load(kp, mask=mask, other=0.0).to(tl.float32)
    k2 = tl.load(kp + HALF, mask=mask, other=0.0).to(tl.float32)
    if SMOOTH:
        sp = k_smooth + h[:, None] * (2 * HALF) + i[None, :]
        k1 = tl.math.div_rn(k1, tl.load(sp, mask=mask, other=1.0))
        k2 = tl.math.div_rn(k2, tl.load(sp + HALF, mask=mask, other=1.0))
    _store_vectors(k_cache, k_scale, slot_off, scale_off, h, s_ch, s_sh, i, HALF, k1, k2, mask, INT8)
    vp = v_ptr + t * s_vt + h[:, None] * s_vh + i[None, :]
    v1 = tl.load(vp, mask=mask, other=0.0).to(tl.float32)
    v2 = tl.load(vp + HALF, mask=mask, other=0.0).to(tl.float32)
    _store_vectors(v_cache, v_scale, slot_off, scale_off, h, s_ch, s_sh, i, HALF, v1, v2, mask, INT8)


@triton.jit
def _attention_inputs_kernel(
    q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv_ptr, q_norm, k_norm,
    cos_ptr, sin_ptr, pos_ptr, slots_ptr, eps,
    H, KVH, HALF, PAGE, s_qkv, s_qt, s_qh, s_cs,
    s_cp, s_csl, s_ch, s_sp, s_ss, s_sh,
    INT8: tl.constexpr, SMOOTH: tl.constexpr, QK_NORM: tl.constexpr,
    H_PAD: tl.constexpr, KVH_PAD: tl.constexpr, HALF_PAD: tl.constexpr, PDL: tl.constexpr,
):
    """Grid: (tokens,). qkv row layout: [q heads | k heads | v heads], each head_dim wide."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    HD = 2 * HALF
    i = tl.arange(0, HALF_PAD)
    imask = (i < HALF)[None, :]
    pos = tl.load(pos_ptr + t).to(tl.int64)
    row = qkv_ptr + t * s_qkv
    x_ty: tl.constexpr = qkv_ptr.dtype.element_ty

    # queries: [H_PAD, HALF_PAD] halves -> (norm) -> rope -> q_out
    h = tl.arange(0, H_PAD)
    qmask = (h < H)[:, None] & imask
    qp = row + h[:, None] * HD + i[None, :]
    q1 = tl.load(qp, mask=qmask, other=0.0).to(tl.float32)
    q2 = tl.load(qp + HALF, mask=qmask, other=0.0).to(tl.float32)
    if QK_NORM:
        q1, q2 = _rms_halves(q1, q2, q_norm, i, HALF, HD, eps, x_ty)
    q1, q2 = _rope_halves(q1, q2, cos_ptr, sin_ptr, s_cs, pos, i, HALF)
    op = q_out + t * s_qt + h[:, None] * s_qh + i[None, :]
    q_ty = q_out.dtype.element_ty
    tl.store(op, cast_to(q1, q_ty), mask=qmask)
    tl.store(op + HALF, cast_to(q2, q_ty), mask=qmask)

    # keys: (norm) -> rope -> rounded to qkv's dtype -> (smoothing) -> cache
    g = tl.arange(0, KVH_PAD)
    kmask = (g < KVH)[:, None] & imask
    slot_off, scale_off = _slot_offsets(slots_ptr, t, PAGE, s_cp, s_csl, s_sp, s_ss)
    kp = row + (H + g[:, None]) * HD + i[None, :]
    k1 = tl.load(kp, mask=kmask, other=0.0).to(tl.float32)
    k2 = tl.load(kp + HALF, mask=kmask, other=0.0).to(tl.float32)
    if QK_NORM:
        k1, k2 = _rms_halves(k1, k2, k_norm, i, HALF, HD, eps, x_ty)
    k1, k2 = _rope_halves(k1, k2, cos_ptr, sin_ptr, s_cs, pos, i, HALF)
    k1 = cast_to(k1, x_ty).to(tl.float32)
    k2 = cast_to(k2, x_ty).to(tl.float32)
    if SMOOTH:
        sp = k_smooth + g[:, None] * HD + i[None, :]
        k1 = tl.math.div_rn(k1, tl.load(sp, mask=kmask, other=1.0))
        k2 = tl.math.div_rn(k2, tl.load(sp + HALF, mask=kmask, other=1.0))
    _store_vectors(k_cache, k_scale, slot_off, scale_off, g, s_ch, s_sh, i, HALF, k1, k2, kmask, INT8)

    # values: straight to the cache
    vp = row + (H + KVH + g[:, None]) * HD + i[None, :]
    v1 = tl.load(vp, mask=kmask, other=0.0).to(tl.float32)
    v2 = tl.load(vp + HALF, mask=kmask, other=0.0).to(tl.float32)
    _store_vectors(v_cache, v_scale, slot_off, scale_off, g, s_ch, s_sh, i, HALF, v1, v2, kmask, INT8)


def _cache_strides(k_cache, k_scale):
    s_cp, s_cs, s_ch, _ = k_cache.stride()
    if k_scale is not None:
        s_sp, s_ss, s_sh = k_scale.stride()
    else:
        s_sp = s_ss = s_sh = 0
    return s_cp, s_cs, s_ch, s_sp, s_ss, s_sh


def _warps(elements: int) -> int:
    return 4 if elements <= 4096 else 8


def launch_rope(out, x, cos, sin, positions):
    n, heads, hd = x.shape
    if n == 0:
        return
    half = hd // 2
    h_pad, half_pad = next_pow2(heads), next_pow2(half)
    _rope_kernel[(n,)](out, x, cos, sin, positions, heads, half, x.stride(0), x.stride(1),
                       out.stride(0), out.stride(1), cos.stride(0), H_PAD=h_pad,
                       HALF_PAD=half_pad, num_warps=_warps(h_pad * half_pad),
                       enable_fp_fusion=False)  # products rounded separately, as the ref


def launch_store_kv(k_cache, v_cache, k_scale, v_scale, k_smooth, k, v, slots):
    n, kv_heads, hd = k.shape
    if n == 0:
        return
    half = hd // 2
    int8 = k_cache.dtype == torch.int8
    kvh_pad, half_pad = next_pow2(kv_heads), next_pow2(half)
    _store_kv_kernel[(n,)](
        k_cache, v_cache, k_scale if int8 else k_cache, v_scale if int8 else v_cache,
        k_smooth if k_smooth is not None else k, k, v, slots,
        kv_heads, half, k_cache.shape[1], k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        *_cache_strides(k_cache, k_scale if int8 else None),
        INT8=int8, SMOOTH=k_smooth is not None, KVH_PAD=kvh_pad, HALF_PAD=half_pad,
        num_warps=_warps(kvh_pad * half_pad), enable_fp_fusion=False,
    )


def launch_attention_inputs(q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm,
                            k_norm, cos, sin, positions, slots, eps):
    n, heads, hd = q_out.shape
    if n == 0:
        return
    kv_heads = k_cache.shape[2]
    half = hd // 2
    int8 = k_cache.dtype == torch.int8
    qk_norm = q_norm is not None
    if qk_norm != (k_norm is not None):
        raise ValueError("q_norm and k_norm must be given together")
    h_pad, kvh_pad, half_pad = next_pow2(heads), next_pow2(kv_heads), next_pow2(half)
    _attention_inputs_kernel[(n,)](
        q_out, k_cache, v_cache, k_scale if int8 else k_cache, v_scale if int8 else v_cache,
        k_smooth if k_smooth is not None else qkv, qkv,
        q_norm if qk_norm else qkv, k_norm if qk_norm else qkv,
        cos, sin, positions, slots, float(eps),
        heads, kv_heads, half, k_cache.shape[1], qkv.stride(0), q_out.stride(0), q_out.stride(1),
        cos.stride(0), *_cache_strides(k_cache, k_scale if int8 else None),
        INT8=int8, SMOOTH=k_smooth is not None, QK_NORM=qk_norm,
        H_PAD=h_pad, KVH_PAD=kvh_pad, HALF_PAD=half_pad, num_warps=_warps(h_pad * half_pad),
        enable_fp_fusion=False,  # RoPE's products rounded separately (no FMA), as the ref
        **pdl_args(),
    )
