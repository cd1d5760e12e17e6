"""FP8 linear products (the product tileinfer/backend/fp8.py defines): an e4m3 weight with one
float32 scale per output row, the input quantized per token row.

* ``_quantize_rows_kernel``: one program per row: ``x_scale = max|x| / 448`` (1 for a row of
  zeros), each element ``x / x_scale`` clamped to +-448 and rounded to the nearest e4m3 value,
  ties to even, both divisions IEEE (``div_rn``), into per-device scratch. The rounding is done
  in float32 arithmetic (``_e4m3_round``) and the exact result converted, so that the
  interpreter, whose float32 -> e4m3 cast rounds ties away and flushes subnormals, gives the
  GPU's bits.
* ``_fp8_kernel``: tiles of BLOCK_M token rows against BLOCK_N weight rows, the linear kernels'
  tensor-core K loop on the e4m3 values (FP8 tensor cores: exact products, float32 sums), the K
  tiles in order, no split-K; the float32 sum times x_scale[i], then the shared epilogue's INT8
  path (times w_scale[j], rounded once to out's dtype; SwiGLU and xIELU as for INT8 weights).

BLOCK_M is 16 for every step a row must keep its bits in (a single sequence's steps, whose
verify rows equal decode rows, and every step of a batch-invariant model), and BLOCK_N, BLOCK_K
and the launch settings depend on the weight only (``fp8_config``: ``FP8_TABLE``, else a
rule): a row's sum is the same instructions in the same order at any row count. Other steps
of more than 16 rows (a batch's or a prefill's rows, which need no such promise) take 64-row
tiles, which read each weight tile for four times the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from tileinfer.backend.hookspecs import Invariance

from .common import DeviceScratch, cdiv, round_half_even, sm_count
from .linear_loops import _dot_k_loop, _epilogue_store

E4M3 = torch.float8_e4m3fn
FP8_CAPABILITY = (8, 9)  # e4m3 conversions and FP8 tensor cores


@triton.jit
def _e4m3_round(v):
    """v (float32, |v| <= 448) rounded to the nearest e4m3 value, ties to even, as float32
    (the sign kept, a negative zero's too). e4m3 has 3 mantissa bits: a value in
    [2**e, 2**(e + 1)) moves in steps of 2**(e - 3), and below 2**-6 (subnormals) in steps of
    2**-9."""
    bits = v.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127  # floor(log2|v|)
    step_exp = tl.maximum(exponent, -6) - 3
    step = ((step_exp + 127) << 23).to(tl.float32, bitcast=True)  # 2**step_exp, exact
    inverse = ((127 - step_exp) << 23).to(tl.float32, bitcast=True)
    magnitude = round_half_even(tl.abs(v) * inverse) * step  # both products exact
    return tl.where(bits < 0, magnitude * -1.0, magnitude)  # (0 - 0.0 would lose the sign)


@triton.jit
def _row_scale(top):
    """The scale of a row whose largest |value| is top: ``top / 448`` (IEEE), 1 for zeros."""
    return tl.where(top > 0, tl.math.div_rn(top, tl.full(top.shape, 448.0, tl.float32)), 1.0)


@triton.jit
def _e4m3_of(v, scale):
    """float32 values v over their row's scale (same shape, or a scalar), clamped to +-448 and
    rounded to e4m3 (IEEE division, ties to even)."""
    v = tl.minimum(tl.maximum(tl.math.div_rn(v, scale), -448.0), 448.0)
    return _e4m3_round(v).to(tl.float8e4nv)


@triton.jit
def _quantize_rows_kernel(x_ptr, s_xm, xq_ptr, scale_ptr, K, BLOCK_K: tl.constexpr):
    """Grid: (rows,). x (rows, K) with row stride s_xm; xq (rows, K) e4m3, contiguous; scale
    (rows,) float32."""
    row = tl.program_id(0).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    x_row = x_ptr + row * s_xm
    amax = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        v = tl.load(x_row + k0 + rk, mask=(k0 + rk) < K, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(v))
    scale = _row_scale(tl.max(amax, axis=0))
    tl.store(scale_ptr + row, scale)
    for k0 in range(0, K, BLOCK_K):
        mask = (k0 + rk) < K
        v = tl.load(x_row + k0 + rk, mask=mask, other=0.0).to(tl.float32)
        tl.store(xq_ptr + row * K + k0 + rk, _e4m3_of(v, scale), mask=mask)


# M is not specialized: Triton would compile M = 1 (a decode step) apart from M = 2..16, and a
# verify step's rows must run the decode step's instructions.
@triton.jit(do_not_specialize=["M"])
def _fp8_kernel(xq_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, x_ptr, M, N_OUT, K, s_om,
                alpha_p, alpha_n, beta, eps,
                ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """Grid: (cdiv(M, BLOCK_M), cdiv(N_OUT, BLOCK_N)). xq (M, K) e4m3 and xs (M,) its scales;
    W (N_OUT, or 2 * N_OUT for SwiGLU: gate rows over up rows, K) e4m3 and ws its row scales;
    x: the unquantized input, for its dtype (SwiGLU rounds gate and up to it)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    x_ty: tl.constexpr = x_ptr.dtype.element_ty
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rm_safe = tl.minimum(rm, M - 1)  # clamped rows: unmasked loads, results dropped at store
    rn_safe = tl.minimum(rn, N_OUT - 1)
    x_rows = xq_ptr + rm_safe.to(tl.int64)[:, None] * K + rk[None, :]
    w_a = w_ptr + rn_safe.to(tl.int64)[:, None] * K + rk[None, :]
    w_b = w_ptr + (rn_safe + N_OUT).to(tl.int64)[:, None] * K + rk[None, :]  # SwiGLU's up rows
    # linear.py's tensor-core K loop: the whole K in order, no int8 conversion, e4m3 operands
    acc_a, acc_b = _dot_k_loop(x_rows, w_a, w_b, 0, K, rk, ACT, False, False, EVEN_K, BLOCK_M,
                               BLOCK_N, BLOCK_K)
    x_scale = tl.load(xs_ptr + rm_safe)[:, None]
    _epilogue_store(acc_a * x_scale, acc_b * x_scale, rm, rn, M, N_OUT, out_ptr, s_om, ws_ptr,
                    alpha_p, alpha_n, beta, eps, ACT=ACT, INT8=True, ROUND_X=False, x_ty=x_ty)


# Per-device scratch of the quantized input: e4m3 values and one float32 scale per row; a
# product with more rows than it holds runs in chunks of rows.
SCRATCH_BYTES = 1 << 24  # 16 MiB: 1,170 rows of K = 14,336
SCRATCH_ROWS = 1 << 14
SCRATCH = DeviceScratch(lambda device: (
    torch.empty(SCRATCH_BYTES, dtype=E4M3, device=device),
    torch.empty(SCRATCH_ROWS, dtype=torch.float32, device=device)))


def fp8_supported(device: torch.device) -> bool:
    """Whether ``device`` runs these kernels: a GPU with FP8 (compute capability 8.9 or newer),
    or the CPU under Triton's interpreter."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device) >= FP8_CAPABILITY


def reserve_scratch(device: torch.device):
    if fp8_supported(device):
        SCRATCH.get(device)


@dataclass(frozen=True)
class Fp8Config:
    """``_fp8_kernel``'s tiles and launch settings for one weight (any row count: a row's sums
    must not depend on it)."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3


# Per weight shape (n_out, k, act): the configurations measured best
# (`benchmarks/ops.py --only fp8-sweep`); other shapes take fp8_config's default.
FP8_TABLE: dict[tuple[int, int, int], Fp8Config] = {}


def fp8_config(n_out: int, k: int, act: int, device: torch.device) -> Fp8Config:
    """FP8_TABLE's entry, else the widest BLOCK_N of 64, 32, 16 that still gives a 1-row step
    about two programs per SM (a step's weight read spread over the whole GPU), K tiles of 128."""
    if (n_out, k, act) in FP8_TABLE:
        return FP8_TABLE[(n_out, k, act)]
    block_n = 64
    while block_n > 16 and cdiv(n_out, block_n) < 2 * sm_count(device):
        block_n //= 2
    return Fp8Config(block_n, 128 if k >= 128 else max(32, triton.next_power_of_2(k)))


def quantize_rows(x, xq, x_scale):
    """xq (M, K) e4m3, contiguous, and x_scale (M,) = x's rows quantized (one launch)."""
    m, k = x.shape
    if m:
        _quantize_rows_kernel[(m,)](x, x.stride(0), xq, x_scale, k,
                                    BLOCK_K=min(1024, triton.next_power_of_2(k)))


def launch_fp8(out, x, weight, weight_scale, act: int = 0, act_args=(0.0, 0.0, 0.0, 0.0),
               invariant=True, config: Fp8Config | None = None, quantized=None):
    """out (M, N_OUT) = act(FP8 product of x (M, K) and the e4m3 weight); SwiGLU's weight has
    2 * N_OUT rows. invariant: the linear contract's batch_invariant (see the module
    docstring). config: overrides fp8_config (benchmarks and tests). quantized: x given as its
    quantized rows (x_q (M, K) e4m3, contiguous, x_scale (M,)), x then only its dtype's
    carrier: the same chunks and tiles without the quantization kernel."""
    m, k = x.shape if quantized is None else quantized[0].shape
    n_out = out.shape[1]
    if m == 0 or n_out == 0:
        return
    if x.stride(1) != 1 or not (weight.is_contiguous() and out.stride(1) == 1):
        raise ValueError("linear (FP8): x, weight and out need a contiguous last dimension")
    if weight_scale is None or weight_scale.dtype != torch.float32:
        raise ValueError("linear (FP8): an e4m3 weight needs its float32 row scales")
    if quantized is not None and not quantized[0].is_contiguous():
        raise ValueError("linear (FP8): the quantized rows must be contiguous")
    xq_all, scales = SCRATCH.get(x.device) if quantized is None else quantized
    cfg = config or fp8_config(n_out, k, act, x.device)
    block_n, block_k = cfg.block_n, min(cfg.block_k, max(32, triton.next_power_of_2(k)))
    block_m = 16 if invariant == Invariance.BATCH or m <= 16 else 64
    chunk = min(SCRATCH_ROWS, SCRATCH_BYTES // k) // 64 * 64
    alpha_p, alpha_n, beta, eps = (float(a) for a in act_args)
    for start in range(0, m, chunk):
        rows = min(chunk, m - start)
        if quantized is None:
            xq, x_scale = xq_all[: rows * k].view(rows, k), scales[:rows]
            part = x[start:start + rows]
            quantize_rows(part, xq, x_scale)
        else:
            xq, x_scale, part = xq_all[start:start + rows], scales[start:start + rows], x
        _fp8_kernel[(cdiv(rows, block_m), cdiv(n_out, block_n))](
            xq, x_scale, weight, weight_scale, out[start:start + rows], part, rows, n_out, k,
            out.stride(0), alpha_p, alpha_n, beta, eps,
            ACT=act, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            EVEN_K=k % block_k == 0, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages)
