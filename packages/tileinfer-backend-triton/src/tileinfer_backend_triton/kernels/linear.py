"""Linear layers: ``out = epilogue(x @ W.T)`` for bf16/fp16/fp32 and INT8 weights.

Two kernels share one epilogue (INT8 per-output-channel scale, the roundings of transformers,
and the fused SwiGLU / xIELU activations):

* ``_gemv_kernel``, decode and verify steps (1..16 tokens). Batch-1 decode reads every weight
  once per token, so
  this kernel is designed from the memory bound: each program streams a [BLOCK_N, BLOCK_K] tile of
  weight rows per iteration with 16-byte vector loads (K is the contiguous axis; rows past N are
  clamped rather than masked so the loads stay unpredicated), and there are enough programs to
  keep every SM's memory pipeline full. A token row accumulates ``w * x`` elementwise in a
  [BLOCK_N, BLOCK_K] float32 register tile and reduces once at the end (no per-iteration
  shuffles). Up to ROW_INVARIANT_MAX_M = 8 tokens (decode, and the verify steps of speculative
  decoding) every row gets its own programs running exactly this code: grid axis 0 is the row,
  so a row's K order, split-K partition and fixup order do not depend on how many rows the step
  has, and a verify step reproduces a 1-token step's logits bit for bit (greedy speculative
  decoding then emits exactly plain greedy's tokens). The programs of the rows of one weight tile
  are adjacent in launch order, so the rows share the tile's DRAM read through L2. 9..16 tokens
  use ``tl.dot`` with the tokens padded to 16 rows (the tensor cores are idle otherwise; the
  weight read is what costs). Where the output is narrow (e.g. 4096 rows on
  132 SMs) the reduction axis is split (split-K) so more programs stream the weight at once; the
  partial sums are combined by the last program to arrive at each output tile (an arrival
  counter, as in CUTLASS's serial split-K / Stream-K fixup): it sums the partials in a fixed
  order (deterministic, unlike float atomics), runs the epilogue and re-arms the counter, so no
  second kernel and no memset are needed, and a CUDA graph can replay it.
  SwiGLU keeps a gate row block and the matching up row block (rows ``n`` and ``inter + n`` of the
  stacked weight) in the same program, so the activation is applied in registers.
* ``_gemm_kernel``, prefill: a tiled ``tl.dot`` GEMM (grouped tile order for L2 reuse,
  software-pipelined K loop; Triton emits wgmma on Hopper), with the same epilogue.

Roundings (as the ref backend and transformers): a float weight's product is rounded to x's dtype
(F.linear's output) before anything else; an INT8 weight's float32 product is scaled and rounded
once. SwiGLU rounds gate and up to x's dtype, silu(gate) to out's dtype, then the product.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .activations import silu_mul_math, xielu_math
from .common import (INTERPRET_MODE, cast_to, cdiv, int8_to, mma, pdl_args, pdl_launch_dependents,
                     pdl_wait, sm_count)

ACT_NONE, ACT_SWIGLU, ACT_XIELU = 0, 1, 2
SKINNY_MAX_M = 16  # up to this many tokens: the GEMV kernel; above: the tiled GEMM
# Up to this many tokens every row runs the 1-token GEMV code (row-invariant results, see above).
ROW_INVARIANT_MAX_M = 8


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
    if w_a.dtype.element_ty == tl.int8:
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
def _dot_k_loop(x_rows, w_a, w_b, k_lo, k_hi, rk, ACT: tl.constexpr, INT8: tl.constexpr,
                F32: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tensor-core K loop over [k_lo, k_hi) (the 9..16-token GEMV and the prefill GEMM): x rows
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
        if INT8:  # int8 values are exact in bf16/fp16
            wa = int8_to(wa, x_ty)
        acc_a = mma(xv, tl.trans(wa), acc_a, F32)
        if ACT == 1:
            if INT8:
                wb = int8_to(wb, x_ty)
            acc_b = mma(xv, tl.trans(wb), acc_b, F32)
    return acc_a, acc_b


# M and P_ROWS are not specialized: Triton would compile M = 1 (a decode step) as a constant,
# a separate binary from the one of M = 2..8; one binary for every row count keeps a verify
# step's rows on exactly the decode step's instructions.
@triton.jit(do_not_specialize=["M", "P_ROWS"])
def _gemv_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr, part_ptr, lock_ptr,
    M, N_OUT, K, s_xm, s_wn, s_om, K_SPLIT, P_ROWS,
    alpha_p, alpha_n, beta, eps,
    ACT: tl.constexpr, INT8: tl.constexpr, ROUND_X: tl.constexpr, F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, UNROLL: tl.constexpr, W_VEC: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid: (M if BLOCK_M == 1 else 1, cdiv(N_OUT, BLOCK_N), SPLIT_K). x: (M, K); W: (N_OUT or
    2 * N_OUT, K). BLOCK_M = 1: one token row per program on the CUDA cores (the row is
    program_id(0)); BLOCK_M = 16: up to 16 tokens on the tensor cores (weights staged through
    shared memory by cp.async, software-pipelined num_stages deep). P_ROWS: rows of the split-K
    partial buffer (M or 16)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    x_ty: tl.constexpr = x_ptr.dtype.element_ty
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    rn_safe = tl.minimum(rn, N_OUT - 1)  # clamped rows: unmasked loads, results dropped at store
    rm_safe = tl.minimum(rm, M - 1)
    w_a = w_ptr + rn_safe.to(tl.int64)[:, None] * s_wn + rk[None, :]
    w_b = w_ptr + (rn_safe + N_OUT).to(tl.int64)[:, None] * s_wn + rk[None, :]  # SwiGLU's up rows
    x_rows = x_ptr + rm_safe.to(tl.int64)[:, None] * s_xm + rk[None, :]
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)

    if BLOCK_M == 1:
        # One token row: elementwise FMAs into a 2-D register tile, one reduction at the end.
        # Triton does not software-pipeline these plain loads, so the loop does it by hand.
        STEP: tl.constexpr = BLOCK_K * UNROLL
        part_a = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        part_b = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        if INT8:
            # INT8: the UNROLL tiles of a step are loaded, then multiplied. (The bf16 loop
            # below measured 15-30% slower for INT8 weights on the H200: its extra registers
            # cost the occupancy that hides the int8 -> float conversions.)
            pdl_launch_dependents(PDL)
            pdl_wait(PDL)
            for k0 in range(k_lo, k_hi, STEP):
                wa, wb = _gemv_w(w_a, w_b, k0, k_hi, rk, True, ACT, EVEN_K, W_VEC)
                xv = _gemv_x(x_rows, k0, k_hi, rk, EVEN_K)
                if UNROLL == 2:
                    wa2, wb2 = _gemv_w(w_a, w_b, k0 + BLOCK_K, k_hi, rk, True, ACT, EVEN_K, W_VEC)
                    xv2 = _gemv_x(x_rows, k0 + BLOCK_K, k_hi, rk, EVEN_K)
                part_a += wa.to(tl.float32) * xv
                if ACT == 1:
                    part_b += wb.to(tl.float32) * xv
                if UNROLL == 2:
                    part_a += wa2.to(tl.float32) * xv2
                    if ACT == 1:
                        part_b += wb2.to(tl.float32) * xv2
        else:
            # The weights of step i + 1 (UNROLL K tiles) are requested before step i's
            # multiply-adds, so UNROLL to 2 * UNROLL tiles are in flight per program. Step 0's
            # weights depend on no earlier kernel: with PDL they are requested before pdl_wait,
            # while the previous kernel still runs (attention before the o projection, a norm
            # before qkv / gate_up).
            wa, wb = _gemv_w(w_a, w_b, k_lo, k_hi, rk, k_lo < k_hi, ACT, EVEN_K, W_VEC)
            wa2, wb2 = wa, wb
            if UNROLL == 2:
                wa2, wb2 = _gemv_w(w_a, w_b, k_lo + BLOCK_K, k_hi, rk, k_lo < k_hi, ACT, EVEN_K, W_VEC)
            pdl_launch_dependents(PDL)
            pdl_wait(PDL)
            for k0 in range(k_lo, k_hi, STEP):
                more = k0 + STEP < k_hi
                na, nb = _gemv_w(w_a, w_b, k0 + STEP, k_hi, rk, more, ACT, EVEN_K, W_VEC)
                na2, nb2 = na, nb
                if UNROLL == 2:
                    na2, nb2 = _gemv_w(w_a, w_b, k0 + STEP + BLOCK_K, k_hi, rk, more, ACT, EVEN_K,
                                       W_VEC)
                xv = _gemv_x(x_rows, k0, k_hi, rk, EVEN_K)
                part_a += wa.to(tl.float32) * xv
                if ACT == 1:
                    part_b += wb.to(tl.float32) * xv
                if UNROLL == 2:
                    xv2 = _gemv_x(x_rows, k0 + BLOCK_K, k_hi, rk, EVEN_K)
                    part_a += wa2.to(tl.float32) * xv2
                    if ACT == 1:
                        part_b += wb2.to(tl.float32) * xv2
                wa, wb, wa2, wb2 = na, nb, na2, nb2
        acc_a = tl.sum(part_a, axis=1)[None, :]
        acc_b = tl.sum(part_b, axis=1)[None, :]
    else:
        # 9..16 tokens: tensor-core dot with the token rows padded to BLOCK_M = 16.
        pdl_launch_dependents(PDL)
        pdl_wait(PDL)
        acc_a, acc_b = _dot_k_loop(x_rows, w_a, w_b, k_lo, k_hi, rk, ACT, INT8, F32, EVEN_K,
                                   BLOCK_M, BLOCK_N, BLOCK_K)

    if SPLIT_K == 1:
        _epilogue_store(acc_a, acc_b, rm, rn, M, N_OUT, out_ptr, s_om, scale_ptr,
                        alpha_p, alpha_n, beta, eps, ACT, INT8, ROUND_X, x_ty)
    else:
        # Split-K fixup: partials [SPLIT_K, P_ROWS, NP] (NP = N_OUT, or 2 * N_OUT for SwiGLU);
        # one arrival counter per (row program, tile).
        NP = N_OUT * (2 if ACT == 1 else 1)
        n_ok = (rn < N_OUT)[None, :]
        lock = lock_ptr + pid_m * tl.num_programs(1) + pid_n
        p_off = (pid_k * P_ROWS + rm)[:, None] * NP + rn[None, :]
        tl.store(part_ptr + p_off, acc_a, mask=n_ok)
        if ACT == 1:
            tl.store(part_ptr + p_off + N_OUT, acc_b, mask=n_ok)
        tl.debug_barrier()  # every thread's partial is written before the release below
        arrived = tl.atomic_add(lock, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:  # the last program of this tile: sum in split order
            acc_a = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                s_off = (s * P_ROWS + rm)[:, None] * NP + rn[None, :]
                acc_a += tl.load(part_ptr + s_off, mask=n_ok, other=0.0, cache_modifier=".cg")
                if ACT == 1:
                    acc_b += tl.load(part_ptr + s_off + N_OUT, mask=n_ok, other=0.0,
                                     cache_modifier=".cg")
            _epilogue_store(acc_a, acc_b, rm, rn, M, N_OUT, out_ptr, s_om, scale_ptr,
                            alpha_p, alpha_n, beta, eps, ACT, INT8, ROUND_X, x_ty)
            tl.atomic_xchg(lock, 0)  # re-arm for the next launch / graph replay


@triton.jit
def _gemm_kernel(
    x_ptr, w_ptr, scale_ptr, out_ptr,
    M, N_OUT, K, s_xm, s_wn, s_om,
    alpha_p, alpha_n, beta, eps,
    ACT: tl.constexpr, INT8: tl.constexpr, ROUND_X: tl.constexpr, F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr,
):
    """Grid: (cdiv(M, BLOCK_M) * cdiv(N_OUT, BLOCK_N),). Tiles visited in groups of GROUP_M
    row blocks so that a group's weight tiles are reused from L2."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N_OUT, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    group_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % in_group) % group_m)
    pid_n = (pid % in_group) // group_m
    x_ty: tl.constexpr = x_ptr.dtype.element_ty

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rm_safe = tl.minimum(rm, M - 1)
    rn_safe = tl.minimum(rn, N_OUT - 1)
    a_ptrs = x_ptr + rm_safe.to(tl.int64)[:, None] * s_xm + rk[None, :]
    wa_ptrs = w_ptr + rn_safe.to(tl.int64)[:, None] * s_wn + rk[None, :]
    wb_ptrs = w_ptr + (rn_safe + N_OUT).to(tl.int64)[:, None] * s_wn + rk[None, :]
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    acc_a, acc_b = _dot_k_loop(a_ptrs, wa_ptrs, wb_ptrs, 0, K, rk, ACT, INT8, F32, EVEN_K,
                               BLOCK_M, BLOCK_N, BLOCK_K)
    _epilogue_store(acc_a, acc_b, rm, rn, M, N_OUT, out_ptr, s_om, scale_ptr,
                    alpha_p, alpha_n, beta, eps, ACT, INT8, ROUND_X, x_ty)


# --- launch configuration --------------------------------------------------------------------


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int = 0  # 0: chosen from the shape (see _split_k)
    num_warps: int = 4
    num_stages: int = 3
    unroll: int = 1  # CUDA-core rows: K tiles loaded per iteration (1 or 2)
    dot: bool = False  # 1..8 tokens through the tensor-core path too (rows padded to 16)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3


# Per-shape GEMV tiles for 1..ROW_INVARIANT_MAX_M tokens, (n_out, k, int8, act) -> GemvConfig,
# over gemv_config's defaults (benchmarks/ops.py's sweep prints its winners in this form): the
# H200 sweep of 2026-11-30 (session 3), where the winner beat the default by more than 2%.
# n_out of a SwiGLU entry (act 1) is the intermediate size; a program takes block_n gate rows
# and the block_n up rows that go with them.
_G = GemvConfig
GEMV_TABLE: dict[tuple[int, int, bool, int], GemvConfig] = {
    # llama3-8b, bf16 (us: default -> entry)
    (6144, 4096, False, 0): _G(8, 256, unroll=2),  # qkv 15.28 -> 12.95
    (14336, 4096, False, 1): _G(4, 256, unroll=2),  # gate_up 60.00 -> 56.16
    (128256, 4096, False, 0): _G(4, 1024, unroll=2),  # lm_head 240.32 -> 229.94
    # llama3-8b, int8 (session 4 sweep, int8 rows loaded in the sums' layout: best us)
    (6144, 4096, True, 0): _G(4, 1024, unroll=2),  # qkv 10.60
    (4096, 4096, True, 0): _G(4, 1024, unroll=2),  # o 8.00
    (14336, 4096, True, 1): _G(4, 1024, unroll=2),  # gate_up 40.53
    (4096, 14336, True, 0): _G(4, 1024, unroll=2),  # down 22.23
    (128256, 4096, True, 0): _G(4, 1024, unroll=2),  # lm_head 152.77
    # llama3.2-1b, bf16
    (3072, 2048, False, 0): _G(4, 512, unroll=2),  # qkv 5.04 -> 4.39
    (2048, 2048, False, 0): _G(4, 1024, unroll=2),  # o 4.72 -> 3.34
    (2048, 8192, False, 0): _G(4, 1024, unroll=2),  # down 10.56 -> 9.58
    (128256, 2048, False, 0): _G(8, 1024, unroll=1),  # lm_head 122.08 -> 116.77
    # llama3.2-1b, int8 (session 4 sweep: best us)
    (3072, 2048, True, 0): _G(4, 1024, unroll=2),  # qkv 4.85
    (2048, 2048, True, 0): _G(4, 1024, unroll=2),  # o 3.65
    (8192, 2048, True, 1): _G(4, 1024, unroll=2),  # gate_up 14.86
    (2048, 8192, True, 0): _G(8, 1024, split_k=2, unroll=2),  # down 9.12
    (128256, 2048, True, 0): _G(4, 1024, unroll=2),  # lm_head 87.15
}


def gemv_config(m: int, n: int, k: int, int8: bool, act: int, f32: bool) -> GemvConfig:
    """Default GEMV tiles, picked from the H200 sweep of benchmarks/ops.py (rows ``sweep:*``,
    llama3-8b and llama3.2-1b decode shapes, 2026-11-30).

    The config of 1..ROW_INVARIANT_MAX_M tokens must not depend on m (a verify step's rows must
    run exactly the 1-token code). One token row: ~4K weight elements per program per K tile
    (16-byte loads, a float32 accumulator of 32 registers a thread, no spills on sm_90), two
    tiles in flight (UNROLL = 2; UNROLL = 1 was 5-20% slower everywhere). Narrow, long tiles won
    the sweep: [8 x 512] for bf16 and int8 (int8 o / down / LM head 10-20% faster than
    [16 x 512] with 8 warps, bf16 o and down 5-8% faster than [16 x 256], others within 1%);
    SwiGLU, whose programs hold a gate and an up row block, [8 x 256] bf16 / [4 x 512] int8 with
    4 warps (6-10% faster than 8 warps of [16 x 256] / [8 x 512]). 9..16 tokens: tensor-core
    tiles [16 x 32 x 128] (bf16) / [16 x 32 x 256] (int8), 4 cp.async stages."""
    if INTERPRET_MODE:  # large tiles, few programs: the interpreter's cost is per program
        return GemvConfig(block_n=64 if act != ACT_SWIGLU else 32, block_k=64 if k <= 256 else 128,
                          unroll=2 if k >= 512 else 1)
    if m <= ROW_INVARIANT_MAX_M:
        entry = None if f32 else GEMV_TABLE.get((n, k, int8, act))
        if entry is not None:
            return entry
        if f32:
            return GemvConfig(block_n=16, block_k=128, num_warps=4)
        if act == ACT_SWIGLU:
            if int8:
                return GemvConfig(block_n=4, block_k=512, num_warps=4, unroll=2)
            return GemvConfig(block_n=8, block_k=256, num_warps=4, unroll=2)
        return GemvConfig(block_n=8, block_k=512, num_warps=4, unroll=2)
    return GemvConfig(block_n=32, block_k=256 if int8 else 128, num_warps=4, num_stages=4)


def gemm_config(m: int, n: int, k: int, act: int, f32: bool) -> GemmConfig:
    if INTERPRET_MODE:
        return GemmConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=1)
    if f32:
        return GemmConfig(block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=2)
    block_m = 64 if m <= 64 else 128
    block_n = 64 if act == ACT_SWIGLU else 128
    return GemmConfig(block_m=block_m, block_n=block_n, block_k=64, num_warps=8 if block_m == 128
                      else 4, num_stages=4 if act != ACT_SWIGLU else 3)


def _split_k(tiles: int, k: int, block_k: int, sms: int) -> int:
    """Split K until there are ~2 programs per SM, each with at least one BLOCK_K of work."""
    split = 1
    while tiles * split < 2 * sms and split < 8 and k >= 2 * split * block_k:
        split *= 2
    return split


class _SplitKScratch:
    """Per-device split-K scratch: float32 partial sums and per-tile arrival counters (zero
    between launches: the last program of each tile re-arms its counter). Allocated once per
    device, on first use or from ``reserve`` (the attention_workspace hook calls it, so a model
    runner allocates it before capturing graphs); never grown: a launch that needs more than
    it holds runs without split-K."""

    PARTIALS = 1 << 21  # floats (8 MiB)
    COUNTERS = 1 << 15

    def __init__(self):
        self._by_device = {}
        self._lock = threading.Lock()

    def get(self, device: torch.device):
        key = (device.type, device.index)
        buffers = self._by_device.get(key)
        if buffers is None:
            with self._lock:
                buffers = self._by_device.get(key)
                if buffers is None:
                    buffers = (torch.empty(self.PARTIALS, dtype=torch.float32, device=device),
                               torch.zeros(self.COUNTERS, dtype=torch.int32, device=device))
                    self._by_device[key] = buffers
        return buffers


SCRATCH = _SplitKScratch()


def reserve_scratch(device: torch.device):
    SCRATCH.get(torch.device(device))


def launch_linear(out, x, weight, weight_scale, act=ACT_NONE, act_args=(0.0, 0.0, 0.0, 0.0),
                  config=None):
    """out (M, N_OUT) = act(x (M, K) @ weight.T); SwiGLU's weight has 2 * N_OUT rows.

    config: a GemvConfig / GemmConfig to override the defaults (benchmarks and tests)."""
    m, k = x.shape
    n_out = out.shape[1]
    if m == 0 or n_out == 0:
        return
    if x.stride(1) != 1 or weight.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("linear: x, weight and out need a contiguous last dimension")
    int8 = weight.dtype == torch.int8
    f32 = (x.dtype == torch.float32 or weight.dtype == torch.float32
           or (not int8 and weight.dtype != x.dtype))
    scale = weight_scale if int8 else x  # a dummy pointer when unused
    alpha_p, alpha_n, beta, eps = (float(a) for a in act_args)
    common = dict(ACT=act, INT8=int8, ROUND_X=not int8, F32=f32)

    if m <= SKINNY_MAX_M and not (isinstance(config, GemmConfig)):
        cfg = config or gemv_config(m, n_out, k, int8, act, f32)
        # Row programs (CUDA cores) up to ROW_INVARIANT_MAX_M tokens, else 16-row dot tiles.
        block_m = 1 if (m <= ROW_INVARIANT_MAX_M and not cfg.dot) else 16
        unroll = cfg.unroll if block_m == 1 else 1
        step = cfg.block_k * unroll
        tiles = cdiv(n_out, cfg.block_n)
        # The split depends on the tiles of one row only, never on m (row invariance).
        split = cfg.split_k or _split_k(tiles, k, step, sm_count(x.device))
        k_split = cdiv(cdiv(k, split), step) * step
        split = cdiv(k, k_split)
        row_programs = m if block_m == 1 else 1
        p_rows = m if block_m == 1 else 16
        part, locks = x, x  # dummies when not split
        if split > 1:
            part, locks = SCRATCH.get(x.device)
            # Capacity checked for the largest step of this path (16 rows), so that whether a
            # shape splits never depends on m.
            n_part = split * 16 * n_out * (2 if act == ACT_SWIGLU else 1)
            if n_part > part.numel() or 16 * tiles > locks.numel():
                split, k_split, part, locks = 1, k, x, x
        _gemv_kernel[(row_programs, tiles, split)](
            x, weight, scale, out, part, locks,
            m, n_out, k, x.stride(0), weight.stride(0), out.stride(0), k_split, p_rows,
            alpha_p, alpha_n, beta, eps,
            BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split,
            EVEN_K=(k % step == 0) and (k_split % step == 0), UNROLL=unroll,
            W_VEC=max(1, min(16, cfg.block_k // (32 * cfg.num_warps))),
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common, **pdl_args(),
        )
        return

    cfg = config if isinstance(config, GemmConfig) else gemm_config(m, n_out, k, act, f32)
    grid = (cdiv(m, cfg.block_m) * cdiv(n_out, cfg.block_n),)
    _gemm_kernel[grid](
        x, weight, scale, out, m, n_out, k, x.stride(0), weight.stride(0), out.stride(0),
        alpha_p, alpha_n, beta, eps,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        EVEN_K=k % cfg.block_k == 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common,
        **pdl_args(),
    )
