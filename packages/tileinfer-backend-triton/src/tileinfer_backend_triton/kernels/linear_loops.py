"""The pieces of the linear kernels (linear.py, linear_fp8.py): the shared epilogue, and the K
loops of ``_gemv_kernel``'s paths: weight and x tiles of the 1-token row programs, the grouped
row programs (``_row_group_k_loop``) and the tensor-core tiles (``_dot_k_loop``)."""

from __future__ import annotations

import triton
import triton.language as tl

from .activations import silu_mul_math, xielu_math
from .common import cast_to, mma, pdl_launch_dependents, pdl_wait, weight_to


@triton.jit
def _epilogue_store(acc_a, acc_b, rm, rn, M, N_OUT, out_ptr, s_om, scale_ptr,
                    alpha_p, alpha_n, beta, eps,
                    ACT: tl.constexpr, INT8: tl.constexpr, ROUND_X: tl.constexpr,
                    x_ty: tl.constexpr):
    """acc_a (and acc_b, the up half of SwiGLU): [BLOCK_M, BLOCK_N] float32 sums of x . w."""
    n_mask = rn < N_OUT
    mask = (rm < M)[:, None] & n_mask[None, :]
    out_ty: tl.constexpr = out_ptr.dtype.element_ty
    if INT8:  # W[j, :] = scale[j] * Wq[j, :]
        acc_a = acc_a * tl.load(scale_ptr + rn, mask=n_mask, other=0.0)[None, :]
        if ACT == 1:
            acc_b = acc_b * tl.load(scale_ptr + N_OUT + rn, mask=n_mask, other=0.0)[None, :]
    if ACT == 1:  # SwiGLU: gate and up rounded to x's dtype, then silu(gate) * up
        gate = cast_to(acc_a, x_ty).to(tl.float32)
        up = cast_to(acc_b, x_ty).to(tl.float32)
        y = silu_mul_math(gate, up, out_ty)
    else:
        y = acc_a
        if ROUND_X:
            y = cast_to(y, x_ty).to(tl.float32)
        if ACT == 2:
            y = xielu_math(cast_to(y, out_ty).to(tl.float32), alpha_p, alpha_n, beta, eps)
        y = cast_to(y, out_ty)
    offs = rm.to(tl.int64)[:, None] * s_om + rn[None, :]
    tl.store(out_ptr + offs, y, mask=mask)


@triton.jit
def _gemv_w(w_a, w_b, k0, k_hi, rk, ok, ACT: tl.constexpr, EVEN_K: tl.constexpr,
            W_VEC: tl.constexpr):
    """Weight rows [BLOCK_N, BLOCK_K] of one K tile (and SwiGLU's up rows); ok: a scalar, False
    loads nothing (zeros). The weights depend on no earlier kernel (see _gemv_kernel's PDL).

    INT8 rows are loaded W_VEC values per thread and load, the float32 sums' layout (x's: BLOCK_K
    over the block's threads): with Triton's own choice (16 int8, one 16-byte load) the products
    were moved to the sums' layout through shared memory, with barriers, at every K tile."""
    if EVEN_K:
        wmask = ok
    else:
        wmask = ((k0 + rk) < k_hi)[None, :] & ok
    pa = w_a + k0
    pb = w_b + k0
    if w_a.dtype.element_ty == tl.int8 or w_a.dtype.element_ty == tl.uint8:
        pa = tl.max_contiguous(pa, [1, W_VEC])
        pb = tl.max_contiguous(pb, [1, W_VEC])
    wa = tl.load(pa, mask=wmask, other=0.0)
    wb = wa
    if ACT == 1:
        wb = tl.load(pb, mask=wmask, other=0.0)
    return wa, wb


@triton.jit
def _gemv_x(x_rows, k0, k_hi, rk, EVEN_K: tl.constexpr):
    """x [1, BLOCK_K] of one K tile, as float32."""
    if EVEN_K:
        return tl.load(x_rows + k0).to(tl.float32)
    else:
        return tl.load(x_rows + k0, mask=((k0 + rk) < k_hi)[None, :], other=0.0).to(tl.float32)


@triton.jit
def _gemv_w_step(w_a, w_b, k, k_hi, rk, ok, ACT: tl.constexpr, EVEN_K: tl.constexpr,
                 UNROLL: tl.constexpr, W_VEC: tl.constexpr, BLOCK_K: tl.constexpr):
    """The weight tiles of one step of the row programs' K loop: UNROLL K tiles from k (the
    second pair is the first again when UNROLL is 1)."""
    wa, wb = _gemv_w(w_a, w_b, k, k_hi, rk, ok, ACT, EVEN_K, W_VEC)
    wa2, wb2 = wa, wb
    if UNROLL == 2:
        wa2, wb2 = _gemv_w(w_a, w_b, k + BLOCK_K, k_hi, rk, ok, ACT, EVEN_K, W_VEC)
    return wa, wb, wa2, wb2


@triton.jit
def _row_fma(part_a, part_b, wa, wb, x_row, k0, k_hi, rk, ACT: tl.constexpr,
             EVEN_K: tl.constexpr):
    """One K tile of one token row: part += w * x (the 1-token program and the grouped rows both
    add through it)."""
    xv = _gemv_x(x_row, k0, k_hi, rk, EVEN_K)
    part_a += wa.to(tl.float32) * xv
    if ACT == 1:
        part_b += wb.to(tl.float32) * xv
    return part_a, part_b


@triton.jit
def _row_group_k_loop(x_ptr, s_xm, row0, M, w_a, w_b, k_lo, k_hi, rk, ACT: tl.constexpr,
                      EVEN_K: tl.constexpr, UNROLL: tl.constexpr, W_VEC: tl.constexpr,
                      PDL: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    """The 1-token program's K loop (float weights, in _gemv_kernel) for ROWS (2 or 4) token
    rows row0.. at once: each weight tile is loaded once for them. Every row keeps its own
    [BLOCK_N, BLOCK_K] float32 tile with the 1-token program's multiply-adds in the same K order
    and one reduction over K at the end: the same ops on the same 2-D shapes in every slot. A
    1-token step runs this program too (row_group), its row in slot 0 and the others clamped
    copies of it. Returns [ROWS, BLOCK_N] sums of both."""
    STEP: tl.constexpr = BLOCK_K * UNROLL
    x0 = x_ptr + tl.minimum(row0, M - 1).to(tl.int64) * s_xm + rk[None, :]
    x1 = x_ptr + tl.minimum(row0 + 1, M - 1).to(tl.int64) * s_xm + rk[None, :]
    x2 = x_ptr + tl.minimum(row0 + 2, M - 1).to(tl.int64) * s_xm + rk[None, :]
    x3 = x_ptr + tl.minimum(row0 + 3, M - 1).to(tl.int64) * s_xm + rk[None, :]
    a0 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    a1, a2, a3, b0, b1, b2, b3 = a0, a0, a0, a0, a0, a0, a0
    wa, wb, wa2, wb2 = _gemv_w_step(w_a, w_b, k_lo, k_hi, rk, k_lo < k_hi, ACT, EVEN_K, UNROLL,
                                    W_VEC, BLOCK_K)
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    for k0 in range(k_lo, k_hi, STEP):
        na, nb, na2, nb2 = _gemv_w_step(w_a, w_b, k0 + STEP, k_hi, rk, k0 + STEP < k_hi, ACT,
                                        EVEN_K, UNROLL, W_VEC, BLOCK_K)
        a0, b0 = _row_fma(a0, b0, wa, wb, x0, k0, k_hi, rk, ACT, EVEN_K)
        a1, b1 = _row_fma(a1, b1, wa, wb, x1, k0, k_hi, rk, ACT, EVEN_K)
        if ROWS == 4:
            a2, b2 = _row_fma(a2, b2, wa, wb, x2, k0, k_hi, rk, ACT, EVEN_K)
            a3, b3 = _row_fma(a3, b3, wa, wb, x3, k0, k_hi, rk, ACT, EVEN_K)
        if UNROLL == 2:
            a0, b0 = _row_fma(a0, b0, wa2, wb2, x0, k0 + BLOCK_K, k_hi, rk, ACT, EVEN_K)
            a1, b1 = _row_fma(a1, b1, wa2, wb2, x1, k0 + BLOCK_K, k_hi, rk, ACT, EVEN_K)
            if ROWS == 4:
                a2, b2 = _row_fma(a2, b2, wa2, wb2, x2, k0 + BLOCK_K, k_hi, rk, ACT, EVEN_K)
                a3, b3 = _row_fma(a3, b3, wa2, wb2, x3, k0 + BLOCK_K, k_hi, rk, ACT, EVEN_K)
        wa, wb, wa2, wb2 = na, nb, na2, nb2
    # Each row's [BLOCK_N] sums placed in its row of the result (a select: the bits stay).
    row = tl.arange(0, ROWS)[:, None]
    acc_a = tl.where(row == 0, tl.sum(a0, axis=1)[None, :], 0.0)
    acc_a = tl.where(row == 1, tl.sum(a1, axis=1)[None, :], acc_a)
    acc_b = acc_a
    if ACT == 1:
        acc_b = tl.where(row == 0, tl.sum(b0, axis=1)[None, :], 0.0)
        acc_b = tl.where(row == 1, tl.sum(b1, axis=1)[None, :], acc_b)
    if ROWS == 4:
        acc_a = tl.where(row == 2, tl.sum(a2, axis=1)[None, :], acc_a)
        acc_a = tl.where(row == 3, tl.sum(a3, axis=1)[None, :], acc_a)
        if ACT == 1:
            acc_b = tl.where(row == 2, tl.sum(b2, axis=1)[None, :], acc_b)
            acc_b = tl.where(row == 3, tl.sum(b3, axis=1)[None, :], acc_b)
    return acc_a, acc_b


@triton.jit
def _dot_k_loop(x_rows, w_a, w_b, k_lo, k_hi, rk, ACT: tl.constexpr, INT8: tl.constexpr,
                F32: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tensor-core K loop over [k_lo, k_hi) (the 9..64-token GEMV and the prefill GEMM): x rows
    [BLOCK_M, BLOCK_K] against weight rows [BLOCK_N, BLOCK_K] (and SwiGLU's up rows); returns
    the float32 sums [BLOCK_M, BLOCK_N] of both. Software-pipelined num_stages deep by Triton."""
    x_ty: tl.constexpr = x_rows.dtype.element_ty
    acc_a = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            xv = tl.load(x_rows + k0)
            wa = tl.load(w_a + k0)
            if ACT == 1:
                wb = tl.load(w_b + k0)
        else:
            kmask = (k0 + rk) < k_hi
            xv = tl.load(x_rows + k0, mask=kmask[None, :], other=0.0)
            wa = tl.load(w_a + k0, mask=kmask[None, :], other=0.0)
            if ACT == 1:
                wb = tl.load(w_b + k0, mask=kmask[None, :], other=0.0)
        if INT8:  # int8 and e4m3 values are exact in bf16/fp16
            wa = weight_to(wa, x_ty)
        acc_a = mma(xv, tl.trans(wa), acc_a, F32)
        if ACT == 1:
            if INT8:
                wb = weight_to(wb, x_ty)
            acc_b = mma(xv, tl.trans(wb), acc_b, F32)
    return acc_a, acc_b


@triton.jit
def _dot_k_segments(x_rows, w_a, w_b, K, K_SPLIT, rk, ACT: tl.constexpr, INT8: tl.constexpr,
                    F32: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``_dot_k_loop`` over K in segments of K_SPLIT, each summed from zero, the segments' sums
    added in order: the float32 sums a split of K into those segments gives (its last program
    adds the partials the same way), in one program."""
    total_a = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    total_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k_lo in range(0, K, K_SPLIT):
        acc_a, acc_b = _dot_k_loop(x_rows, w_a, w_b, k_lo, tl.minimum(k_lo + K_SPLIT, K), rk,
                                   ACT, INT8, F32, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
        total_a += acc_a
        if ACT == 1:
            total_b += acc_b
    return total_a, total_b
