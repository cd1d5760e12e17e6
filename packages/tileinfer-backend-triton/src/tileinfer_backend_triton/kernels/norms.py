"""RMSNorm and the fused residual-add + RMSNorm.

One program normalizes BLOCK_R rows of length D (BLOCK_D = next power of two >= D) held whole in
registers: a decode step's hidden row (1 x 4096) is one program, per-head q/k norms
((tokens * heads) x 128) pack many rows per program. Rows are addressed through two strides so
that views such as the q heads of a fused qkv row, (n, heads, head_dim), need no copy.

Rounding follows transformers' LlamaRMSNorm: ``x_hat = x * rsqrt(mean(x^2) + eps)`` in float32,
rounded to x's dtype, then ``weight * x_hat`` rounded to out's dtype; Gemma's (GEMMA) multiplies
the float32 x_hat by its float32 weight and rounds once. The fused op first rounds
``residual + delta`` to the residual's dtype, stores it, and normalizes that rounded value;
with E4M3 (add_rmsnorm_e4m3) it also writes the normalized rows quantized per row for an FP8
product, with linear_fp8.py's arithmetic (``_row_scale``, ``_e4m3_of``), so the bits of its
quantization kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import INTERPRET_MODE, cast_to, next_pow2, pdl_args, pdl_launch_dependents, pdl_wait
from .linear_fp8 import _e4m3_of, _row_scale


@triton.jit(do_not_specialize=["R"])  # R = 1 (a decode step) compiles like any row count
def _rms_rows_kernel(
    x_ptr, w_ptr, out_ptr, delta_ptr, q_ptr, scale_ptr,
    R, D, INNER,                      # rows, row length, rows per outer index (3-D views)
    sx0, sx1, so0, so1, sd0, sd1,     # (outer, inner) strides of x/residual, out, delta
    eps,
    ADD: tl.constexpr, GEMMA: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr, E4M3: tl.constexpr,
):
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_D)
    outer, inner = rows // INNER, rows % INNER
    rmask = rows < R
    mask = rmask[:, None] & (cols < D)[None, :]
    x_off = (outer * sx0 + inner * sx1)[:, None] + cols[None, :]
    x_raw = tl.load(x_ptr + x_off, mask=mask, other=0.0)
    x = x_raw.to(tl.float32)
    if ADD:  # residual += delta, rounded to the residual's dtype (stored back in place)
        d_off = (outer * sd0 + inner * sd1)[:, None] + cols[None, :]
        delta = tl.load(delta_ptr + d_off, mask=mask, other=0.0).to(tl.float32)
        x = cast_to(x + delta, x_raw.dtype)
        tl.store(x_ptr + x_off, x, mask=mask)
        x = x.to(tl.float32)
    mean_sq = tl.math.div_rn(tl.sum(x * x, axis=1), D.to(tl.float32))
    out_ty = out_ptr.dtype.element_ty
    if GEMMA:  # Gemma: the float32 weight (1 + w) on the float32 x_hat, rounded once
        w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
        y = cast_to(x * tl.rsqrt(mean_sq + eps)[:, None] * w[None, :], out_ty)
    else:
        x_hat = cast_to(x * tl.rsqrt(mean_sq + eps)[:, None], x_raw.dtype)
        w = cast_to(tl.load(w_ptr + cols, mask=cols < D, other=0.0), out_ty).to(tl.float32)
        y = cast_to(w[None, :] * cast_to(x_hat, out_ty).to(tl.float32), out_ty)
    o_off = (outer * so0 + inner * so1)[:, None] + cols[None, :]
    tl.store(out_ptr + o_off, y, mask=mask)
    if E4M3:  # y's rows quantized: q (R, D) e4m3, contiguous; scale (R,) float32
        v = tl.where(mask, y.to(tl.float32), 0.0)
        scale = _row_scale(tl.max(tl.abs(v), axis=1))
        tl.store(scale_ptr + rows, scale, mask=rmask)
        q = _e4m3_of(v, tl.broadcast_to(scale[:, None], BLOCK_R, BLOCK_D))
        tl.store(q_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], q, mask=mask)


def _as_rows(t: torch.Tensor):
    """(outer, inner, D) view parameters of a 1-, 2- or 3-D tensor with a contiguous last dim:
    returns (rows, inner, stride_outer, stride_inner)."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError("the last dimension must be contiguous")
    if t.dim() == 1:
        return 1, 1, 0, 0
    if t.dim() == 2:
        return t.shape[0], 1, t.stride(0), 0
    if t.dim() == 3:
        return t.shape[0] * t.shape[1], t.shape[1], t.stride(0), t.stride(1)
    flat = t.view(-1, t.shape[-1])  # more dims: must be viewable as rows
    return flat.shape[0], 1, flat.stride(0), 0


def _config(d: int):
    """(BLOCK_R, BLOCK_D, num_warps), a function of the row length only: a row's reduction tree
    must not depend on how many rows the step has (a speculative verify step normalizes each
    row bit for bit as a 1-token step does). Hidden rows (>= 1024) get a program each; short
    rows (per-head norms) are packed to fill ~4K (GPU) / 16K (interpreter) elements."""
    block_d = next_pow2(d)
    budget = 16384 if INTERPRET_MODE else 4096
    block_r = 1 if block_d >= 1024 else max(1, budget // block_d)
    num_warps = 4 if block_r * block_d <= 2048 else 8 if block_r * block_d <= 8192 else 16
    return block_r, block_d, num_warps


def launch_rmsnorm(out, x, weight, eps, residual_delta=None, gemma=False, e4m3=None):
    """rmsnorm(out, x, weight, eps); with residual_delta, x is the residual updated in place;
    gemma: Gemma's norm (a float32 weight, one rounding; out may be x); e4m3: (out_q, out_scale)
    for out's rows quantized (add_rmsnorm_e4m3: 2-D contiguous rows)."""
    d = x.shape[-1]
    rows, inner, sx0, sx1 = _as_rows(x)
    _, _, so0, so1 = _as_rows(out)
    if residual_delta is not None:
        _, _, sd0, sd1 = _as_rows(residual_delta)
        delta = residual_delta
    else:
        sd0 = sd1 = 0
        delta = x
    if rows == 0:
        return
    block_r, block_d, num_warps = _config(d)
    grid = (triton.cdiv(rows, block_r),)
    out_q, out_scale = e4m3 if e4m3 is not None else (out, out)
    _rms_rows_kernel[grid](
        x, weight, out, delta, out_q, out_scale, rows, d, inner, sx0, sx1, so0, so1, sd0, sd1,
        float(eps), ADD=residual_delta is not None, GEMMA=gemma, BLOCK_R=block_r,
        BLOCK_D=block_d, num_warps=num_warps, E4M3=e4m3 is not None, **pdl_args(),
    )
