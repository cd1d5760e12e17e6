"""Linear layers: ``out = epilogue(x @ W.T)`` for bf16/fp16/fp32 and INT8 weights (and e4m3 bits,
the weight-only FP8 product, on INT8's path: common.weight_to).

Two kernels share one epilogue (INT8 per-output-channel scale, the roundings of transformers,
the fused SwiGLU / xIELU activations):

* ``_gemv_kernel``, decode, verify and batched steps (1..64 tokens), built around the weight
  read: each program streams [BLOCK_N, BLOCK_K] weight tiles with 16-byte loads (rows past N
  clamped, not masked) and accumulates ``w * x`` in a float32 register tile, reduced once at
  the end. Up to ROW_INVARIANT_MAX_M tokens of a single sequence's step (``invariant``) every
  row runs the 1-token code on its own programs (grid axis 0), or, where the config asks
  (``row_group``), every step of the sequence (one token too) runs on programs of 2 or 4 rows
  that load each weight tile once for them and keep a 2-D tile per row, so a verify step's rows
  equal decode steps bit for bit; batched steps of 2..64 rows and any step of 9..64 use
  ``tl.dot`` on rows padded to 16, 32 or 64 (the weight read once for all rows). Narrow outputs
  split K; the last program to arrive at a tile (an arrival counter) sums the partials in split
  order, runs the epilogue and re-arms the counter. SwiGLU takes gate rows ``n`` and up rows ``inter + n``
  in the same program.
* ``_gemm_kernel``, prefill: a tiled ``tl.dot`` GEMM (grouped tile order, pipelined K loop).

Batch-invariant steps (``Invariance.BATCH``) of any number of rows run ``_gemv_kernel``'s
tensor-core path on tiles of 16 or 64 token rows (one row program per tile, ``invariant_config``)
over K segments that depend on the weight alone (``invariant_segment``): each segment summed in
K order, 16-wide tensor-core products in sequence, and the segments added in order, split across
programs or in one (``_launch_invariant``), whatever the step's row count and the tiles.

Roundings (as the ref backend): a float weight's product is rounded to x's dtype first, except
for a plain product into a float32 out (the logits), which stores the float32 sum unrounded; an
INT8 weight's float32 product is scaled and rounded once, to out's dtype. SwiGLU rounds gate and up to x's dtype,
silu(gate) to out's dtype, then the product. The launch configuration (tiles, the per-shape
GEMV table, split-K and its scratch) is in linear_config.py, the epilogue and the K loops in
linear_loops.py; docs/triton-kernels.md has the design.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from tileinfer.backend.hookspecs import Invariance

from .common import cdiv, pdl_args, pdl_launch_dependents, pdl_wait, sm_count, weight_to
# The launch configuration is in linear_config; its names are this module's too.
from .linear_config import (ACT_NONE, ACT_SWIGLU, ACT_XIELU, GEMV_TABLE, ROW_INVARIANT_MAX_M,
                            SCRATCH, SKINNY_MAX_M, GemmConfig, GemvConfig, InvariantConfig,
                            gemm_config, gemv_config, invariant_config, invariant_segment,
                            reserve_scratch, row_group, split_k_for, split_scratch)
from .linear_loops import (_dot_k_loop, _dot_k_segments, _epilogue_store, _gemv_w,
                           _gemv_w_step, _gemv_x, _row_fma, _row_group_k_loop)

__all__ = ["ACT_NONE", "ACT_SWIGLU", "ACT_XIELU", "GEMV_TABLE", "InvariantConfig",
           "ROW_INVARIANT_MAX_M", "SCRATCH", "SKINNY_MAX_M", "GemmConfig", "GemvConfig",
           "gemm_config", "gemv_config", "invariant_config", "launch_linear", "reserve_scratch",
           "split_k_for"]


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
    PDL: tl.constexpr, SEGMENTED: tl.constexpr = False,
):
    """Grid: (cdiv(M, BLOCK_M) if BLOCK_M < 16 else 1, cdiv(N_OUT, BLOCK_N), SPLIT_K). x: (M, K);
    W: (N_OUT or 2 * N_OUT, K). BLOCK_M = 1: one token row per program on the CUDA cores (the row
    is program_id(0)); 2 or 4: row programs of that many token rows (float weights), each row
    in its own 2-D tile (a 1-token step in the first); BLOCK_M = 16, 32 or 64: up to that many
    tokens on the tensor cores (weights staged through shared memory by cp.async, software-pipelined
    num_stages deep). P_ROWS: rows of the split-K partial buffer (the programs' rows).
    SEGMENTED (tensor-core tiles, SPLIT_K = 1): K in segments of K_SPLIT, summed one after
    another in the program as a split of K into them would sum them."""
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
            # INT8: the UNROLL tiles of a step are loaded, then multiplied (the prefetching
            # loop below is slower here: its registers cost the occupancy that hides the
            # int8 -> float conversions).
            pdl_launch_dependents(PDL)
            pdl_wait(PDL)
            for k0 in range(k_lo, k_hi, STEP):
                wa, wb = _gemv_w(w_a, w_b, k0, k_hi, rk, True, ACT, EVEN_K, W_VEC)
                xv = _gemv_x(x_rows, k0, k_hi, rk, EVEN_K)
                if UNROLL == 2:
                    wa2, wb2 = _gemv_w(w_a, w_b, k0 + BLOCK_K, k_hi, rk, True, ACT, EVEN_K, W_VEC)
                    xv2 = _gemv_x(x_rows, k0 + BLOCK_K, k_hi, rk, EVEN_K)
                part_a += weight_to(wa, tl.float32) * xv
                if ACT == 1:
                    part_b += weight_to(wb, tl.float32) * xv
                if UNROLL == 2:
                    part_a += weight_to(wa2, tl.float32) * xv2
                    if ACT == 1:
                        part_b += weight_to(wb2, tl.float32) * xv2
        else:
            # The weights of step i + 1 (UNROLL K tiles) are requested before step i's
            # multiply-adds, so UNROLL to 2 * UNROLL tiles are in flight per program. Step 0's
            # weights depend on no earlier kernel: with PDL they are requested before pdl_wait,
            # while the previous kernel still runs (attention before the o projection, a norm
            # before qkv / gate_up).
            wa, wb, wa2, wb2 = _gemv_w_step(w_a, w_b, k_lo, k_hi, rk, k_lo < k_hi, ACT, EVEN_K,
                                            UNROLL, W_VEC, BLOCK_K)
            pdl_launch_dependents(PDL)
            pdl_wait(PDL)
            for k0 in range(k_lo, k_hi, STEP):
                na, nb, na2, nb2 = _gemv_w_step(w_a, w_b, k0 + STEP, k_hi, rk, k0 + STEP < k_hi,
                                                ACT, EVEN_K, UNROLL, W_VEC, BLOCK_K)
                part_a, part_b = _row_fma(part_a, part_b, wa, wb, x_rows, k0, k_hi, rk, ACT,
                                          EVEN_K)
                if UNROLL == 2:
                    part_a, part_b = _row_fma(part_a, part_b, wa2, wb2, x_rows, k0 + BLOCK_K,
                                              k_hi, rk, ACT, EVEN_K)
                wa, wb, wa2, wb2 = na, nb, na2, nb2
        acc_a = tl.sum(part_a, axis=1)[None, :]
        acc_b = tl.sum(part_b, axis=1)[None, :]
    elif BLOCK_M < 16:
        # BLOCK_M (2 or 4) token rows, each on the 1-token program's arithmetic.
        acc_a, acc_b = _row_group_k_loop(x_ptr, s_xm, pid_m * BLOCK_M, M, w_a, w_b, k_lo, k_hi,
                                         rk, ACT, EVEN_K, UNROLL, W_VEC, PDL, BLOCK_M, BLOCK_N,
                                         BLOCK_K)
    else:
        # Tensor-core dot with the token rows padded to BLOCK_M.
        pdl_launch_dependents(PDL)
        pdl_wait(PDL)
        if SEGMENTED:
            acc_a, acc_b = _dot_k_segments(x_rows, w_a, w_b, K, K_SPLIT, rk, ACT, INT8, F32,
                                           EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
        else:
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


# --- launch ------------------------------------------------------------------------------------


def launch_linear(out, x, weight, weight_scale, act=ACT_NONE, act_args=(0.0, 0.0, 0.0, 0.0),
                  config=None, invariant=True):
    """out (M, N_OUT) = act(x (M, K) @ weight.T); SwiGLU's weight has 2 * N_OUT rows.

    config: a GemvConfig / GemmConfig / InvariantConfig to override the defaults (benchmarks
    and tests).
    invariant: the linear contract's batch_invariant (False: rows of separate sequences, so
    2..ROW_INVARIANT_MAX_M rows may take the tensor-core tiles; ``Invariance.BATCH``: the
    batch-invariant tiles at any row count)."""
    m, k = x.shape
    n_out = out.shape[1]
    if m == 0 or n_out == 0:
        return
    if x.stride(1) != 1 or weight.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("linear: x, weight and out need a contiguous last dimension")
    int8 = weight.dtype in (torch.int8, torch.uint8)  # one-byte weights: int8 or e4m3 bits
    f32 = (x.dtype == torch.float32 or weight.dtype == torch.float32
           or (not int8 and weight.dtype != x.dtype))
    scale = weight_scale if int8 else x  # a dummy pointer when unused
    alpha_p, alpha_n, beta, eps = (float(a) for a in act_args)
    # A float weight's product is rounded to x's dtype (F.linear's output), except a plain
    # product into a float32 out (the logits: the float32 sum itself, the linear contract).
    round_x = not int8 and not (act == ACT_NONE and out.dtype == torch.float32)
    common = dict(ACT=act, INT8=int8, ROUND_X=round_x, F32=f32)

    if invariant == Invariance.BATCH:
        _launch_invariant(out, x, weight, scale, act, config, common,
                          (alpha_p, alpha_n, beta, eps))
        return

    if m <= SKINNY_MAX_M and not (isinstance(config, GemmConfig)):
        rows = m == 1 or (m <= ROW_INVARIANT_MAX_M and invariant)
        cfg = config or gemv_config(rows, n_out, k, int8, act, f32)
        # Row programs (CUDA cores) for one token and a single sequence's steps of up to
        # ROW_INVARIANT_MAX_M tokens (one row each, or row_group's rows), else dot tiles of 16,
        # 32 or 64 token rows.
        if rows and not cfg.dot:
            block_m = row_group(cfg, m, int8)
        else:
            block_m = max(16, triton.next_power_of_2(m))
        unroll = cfg.unroll if block_m < 16 else 1
        step = cfg.block_k * unroll
        tiles = cdiv(n_out, cfg.block_n)
        # The split depends on the tiles of one row only, never on m (row invariance).
        split = cfg.split_k or split_k_for(tiles, k, step, sm_count(x.device))
        k_split = cdiv(cdiv(k, split), step) * step
        split = cdiv(k, k_split)
        row_programs = cdiv(m, block_m) if block_m < 16 else 1
        p_rows = row_programs * block_m
        part, locks = x, x  # dummies when not split
        if split > 1:
            # Capacity checked for 16 rows up to 16 (so that whether a 1..8-row shape splits
            # never depends on m), else for the tile's rows.
            n_part = split * max(16, block_m) * n_out * (2 if act == ACT_SWIGLU else 1)
            scratch = split_scratch(x.device, n_part, 16 * tiles)
            if scratch is None:
                split, k_split = 1, k
            else:
                part, locks = scratch
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


def _launch_invariant(out, x, weight, scale, act, config, common, act_args):
    """A batch-invariant step: tensor-core tiles by the row count (``invariant_config``) over
    the weight's K segments (``invariant_segment``). A step whose tiles leave the GPU short of
    programs splits K into the segments across programs, whose partial sums the last one to
    arrive adds in segment order; other steps add them in the same order in one program. Both
    give every row the same bits."""
    m, k = x.shape
    n_out = out.shape[1]
    f32_out = out.dtype == torch.float32
    f32, int8 = common["F32"], common["INT8"]
    cfg = (config if isinstance(config, InvariantConfig)
           else invariant_config(n_out, k, act, f32_out, f32, int8, m))
    sms = sm_count(x.device)
    segment = invariant_segment(n_out, k, act, f32_out, f32, int8, sms)
    segments = cdiv(k, segment)
    row_programs, tiles = cdiv(m, cfg.block_m), cdiv(n_out, cfg.block_n)
    split, part, locks = 1, x, x  # dummies when not split
    if segments > 1 and row_programs * tiles < 2 * sms:
        n_part = segments * row_programs * cfg.block_m * n_out * (2 if act == ACT_SWIGLU else 1)
        scratch = split_scratch(x.device, n_part, row_programs * tiles)
        if scratch is not None:
            split, (part, locks) = segments, scratch
    _gemv_kernel[(row_programs, tiles, split)](
        x, weight, scale, out, part, locks,
        m, n_out, k, x.stride(0), weight.stride(0), out.stride(0), segment,
        row_programs * cfg.block_m, *act_args,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split,
        EVEN_K=k % cfg.block_k == 0, UNROLL=1, W_VEC=1, SEGMENTED=split == 1 and segments > 1,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **common, **pdl_args(),
    )
