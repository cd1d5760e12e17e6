"""Elementwise activations: SwiGLU's ``silu(gate) * up`` and Apertus' xIELU.

The ``*_math`` functions are the linear kernels' fused epilogues (linear.py). The standalone
kernels are behind no op of the contract (the ops fuse them); their launchers remain for code
that needs the activation alone and are tested against the ref backend. Grid: (rows, column
blocks).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import INTERPRET_MODE, cast_to, exact_expm1, next_pow2, silu


@triton.jit
def silu_mul_math(gate, up, out_ty: tl.constexpr):
    """transformers' ``act_fn(gate) * up``: silu rounded to the dtype, then the product rounded."""
    act = cast_to(silu(gate), out_ty).to(tl.float32)
    return cast_to(act * up, out_ty)


@triton.jit
def xielu_math(x, alpha_p, alpha_n, beta, eps):
    """xIELU (arXiv:2411.13010) in float32, as transformers' XIELUActivation."""
    pos = alpha_p * x * x + beta * x
    neg = (exact_expm1(tl.minimum(x, eps)) - x) * alpha_n + beta * x
    return tl.where(x > 0, pos, neg)


@triton.jit
def _silu_mul_kernel(out_ptr, gu_ptr, INTER, s_out, s_gu, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    gate = tl.load(gu_ptr + row * s_gu + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gu_ptr + row * s_gu + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    y = silu_mul_math(gate, up, out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * s_out + cols, y, mask=mask)


@triton.jit
def _xielu_kernel(out_ptr, x_ptr, D, s_out, s_x, alpha_p, alpha_n, beta, eps,
                  BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(x_ptr + row * s_x + cols, mask=mask, other=0.0).to(tl.float32)
    y = xielu_math(x, alpha_p, alpha_n, beta, eps)
    tl.store(out_ptr + row * s_out + cols, cast_to(y, out_ptr.dtype.element_ty), mask=mask)


def _block(d):
    return min(next_pow2(d), 8192 if INTERPRET_MODE else 1024)


def launch_silu_mul(out, gate_up):
    n, inter = out.shape
    if n == 0:
        return
    block = _block(inter)
    _silu_mul_kernel[(n, triton.cdiv(inter, block))](out, gate_up, inter, out.stride(0),
                                                     gate_up.stride(0), BLOCK=block, num_warps=4)


def launch_xielu(out, x, alpha_p, alpha_n, beta, eps):
    x2, o2 = x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1])
    n, d = x2.shape
    if n == 0:
        return
    block = _block(d)
    _xielu_kernel[(n, triton.cdiv(d, block))](o2, x2, d, o2.stride(0), x2.stride(0),
                                              float(alpha_p), float(alpha_n), float(beta),
                                              float(eps), BLOCK=block, num_warps=4,
                                              enable_fp_fusion=False)  # no FMA: as the ref
