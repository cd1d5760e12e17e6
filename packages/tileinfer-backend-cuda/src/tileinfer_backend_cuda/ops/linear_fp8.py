"""FP8 linear products (the product of tileinfer/backend/fp8.py): an e4m3 weight with one scale
per output row, the input quantized per token row by fp8_quant.cu into per-device scratch, then

* steps of up to tuning.wide_max_tokens(fp8=True) rows, and every step of a batch-invariant
  model: gemv.cu's FP8 build through linear.invariant_gemv (launches of up to 64 rows), which
  reads the weight once for all rows, on the weight's batch-invariant configuration (its warps
  fixed per weight), so a row's sum is the same bits at any row count;
* larger steps on Hopper, up to gemm_fp8.MAX_TOKENS rows: gemm_fp8.py, FP8 tensor cores with
  the MLP's epilogue in the kernel;
* the rest: ``torch._scaled_mm``, cuBLASLt's FP8 tensor-core GEMM with row-wise scales (bf16
  output), then silu_mul / xielu for the MLP ops.

Steps with more rows than the scratch holds run in chunks of rows (each row's quantization is
its own). The e4m3-input ops (an input that add_rmsnorm_e4m3 quantized) run the same chunks on
the same kernels without the quantization launches. Needs compute capability 8.9 or newer
(e4m3 conversions; FP8 tensor cores).
"""

from __future__ import annotations

import torch

from tileinfer.backend import fp8
from tileinfer.backend.fp8 import E4M3
from tileinfer.backend.hookspecs import Invariance

from .common import FP8_SCRATCH, Fp8Scratch, aligned, contig, dev, fallback, kernel
from . import elementwise, gemm_fp8
from .linear import NO_XIELU, invariant_gemv
from .tuning import pdl, wide_max_tokens


QUANT_THREADS = 256
# fp8_quant.cu keeps a row's x in registers (read once) up to this many 16-byte chunks a thread
# (K <= 16,384 with 256 threads), else reads it twice.
QUANT_MAX_ITEMS = 8


def fp8_ok(out, x, weight, weight_scale) -> bool:
    """Layouts the FP8 kernels take: bf16 x with 16-byte aligned rows, K % 16 == 0, contiguous
    e4m3 weight, float32 scales, a bf16 or float32 out."""
    return (x.dim() == 2 and out.dim() == 2 and x.dtype == torch.bfloat16
            and weight.dtype == E4M3 and weight_scale is not None
            and weight_scale.dtype == torch.float32 and out.dtype in (torch.bfloat16, torch.float32)
            and x.stride(1) == 1 and x.stride(0) % 8 == 0 and x.shape[1] % 16 == 0
            and contig(weight, out, weight_scale) and aligned(x, weight))


def quantize_rows(x, xq, x_scale):
    """fp8_quant.cu: x (n, K) bf16 -> xq (n, K) e4m3 bytes, x_scale (n,) float32."""
    n, k_dim = x.shape
    device = dev(x)
    pdl_on = pdl(device)
    items = -(-k_dim // (8 * QUANT_THREADS))
    k = kernel("fp8_quant.cu", "quantize_rows", "pppiq", device,
               {"THREADS": QUANT_THREADS, "PDL": int(pdl_on),
                "ITEMS": items if items <= QUANT_MAX_ITEMS else 0})
    k.launch((n,), (QUANT_THREADS,), (xq, x_scale, x, k_dim, x.stride(0)), pdl=pdl_on)


def quantize_rows_of(x, xq, x_scale):
    """xq, x_scale = x's rows quantized (tileinfer.backend.fp8.quantize_rows): fp8_quant.cu where
    it takes x's layout, else the definition's arithmetic in torch (the same bits)."""
    if (x.dim() == 2 and x.dtype == torch.bfloat16 and x.stride(1) == 1 and x.stride(0) % 8 == 0
            and x.shape[1] % 8 == 0 and contig(xq, x_scale) and aligned(x, xq)):
        return quantize_rows(x, xq, x_scale)
    q, scale = fp8.quantize_rows(x)
    xq.copy_(q.view(xq.dtype))
    x_scale.copy_(scale)


def _scaled_mm(out, xq, x_scale, weight, weight_scale):
    """out (n, O) bf16 = the FP8 product on cuBLASLt's tensor cores."""
    torch._scaled_mm(xq.view(E4M3), weight.t(), scale_a=x_scale[:, None],
                     scale_b=weight_scale[None, :], out_dtype=out.dtype, out=out)


def _route(out, x, weight, invariant: bool) -> str:
    """Which kernel takes a product: "gemv" (gemv.cu: few rows, or batch-invariant), "wgmma"
    (gemm_fp8.py) or "scaled_mm" (no epilogue of its own: the MLP ops add theirs)."""
    n, k_dim = x.shape
    if n <= wide_max_tokens(True, fp8=True) or invariant:
        return "gemv"
    if out.dtype == torch.bfloat16 and gemm_fp8.takes(n, k_dim, dev(x)):
        return "wgmma"
    return "scaled_mm" if weight.shape[0] % 16 == 0 and out.dtype == torch.bfloat16 else "gemv"


def _row_chunks(n: int, k_dim: int) -> list[tuple[int, int]]:
    """The (start, stop) row ranges a product of n rows runs in: as many as the scratch holds
    (an input given quantized runs in the same chunks, so that each takes the same kernel)."""
    chunk = min(Fp8Scratch.ROWS, Fp8Scratch.BYTES // k_dim)
    return [(start, min(n, start + chunk)) for start in range(0, n, chunk)]


def _quantized_product(out, xq, x_scale, weight, weight_scale, epilogue, xielu_params, route):
    """out = epilogue(FP8 product) of the rows xq (n, K) e4m3 with x_scale (n,) on route's
    kernel (one chunk of rows)."""
    if route == "scaled_mm":
        _scaled_mm(out, xq, x_scale, weight, weight_scale)
    elif route == "wgmma":
        gemm_fp8.launch(out, xq, x_scale, weight, weight_scale, epilogue, xielu_params, dev(xq))
    else:
        invariant_gemv(out, xq, weight, weight_scale, epilogue, xielu_params, x_scale)


def _product(out, x, weight, weight_scale, epilogue, xielu_params, route: str):
    """out = epilogue(FP8 product of x and the weight) on `route`'s kernel (_route; "scaled_mm"
    only without an epilogue), in chunks of rows that fit the scratch; False where the scratch
    is missing (first needed inside a graph capture)."""
    n, k_dim = x.shape
    buffers = FP8_SCRATCH.get(dev(x))
    if buffers is None:
        return False
    scratch, scales = buffers
    for start, stop in _row_chunks(n, k_dim):
        xq = scratch[: (stop - start) * k_dim].view(stop - start, k_dim)
        x_scale = scales[: stop - start]
        quantize_rows(x[start:stop], xq, x_scale)
        _quantized_product(out[start:stop], xq, x_scale, weight, weight_scale, epilogue,
                           xielu_params, route)
    return True


def _given_product(out, x_q, x_scale, weight, weight_scale, epilogue, xielu_params, route):
    """_product for an input given quantized (the e4m3-input ops): the same chunks and kernels,
    without the quantization launches; True (it needs no scratch)."""
    for start, stop in _row_chunks(*x_q.shape):
        _quantized_product(out[start:stop], x_q[start:stop], x_scale[start:stop], weight,
                           weight_scale, epilogue, xielu_params, route)
    return True


def linear(out, x, weight, weight_scale, batch_invariant):
    if not (fp8_ok(out, x, weight, weight_scale)
            and _product(out, x, weight, weight_scale, "none", NO_XIELU,
                         _route(out, x, weight, _invariant(batch_invariant)))):
        fallback("linear", "FP8 layout", out, x, weight, weight_scale, batch_invariant)


def _swiglu(out, gate_up, route: str, product) -> bool:
    """linear_swiglu on route's kernel: the SwiGLU epilogue in the product, or (scaled_mm, which
    has none) the product into gate_up, then silu_mul. product(dst, epilogue) runs the FP8
    product into dst and says whether it ran; False where neither way runs."""
    if route != "scaled_mm":
        return product(out, "swiglu")
    if (gate_up.dtype == torch.bfloat16 and gate_up.is_contiguous()
            and elementwise.silu_mul_ok(out, gate_up) and product(gate_up, "none")):
        elementwise.silu_mul(out, gate_up)
        return True
    return False


def linear_swiglu(out, x, weight, weight_scale, gate_up, batch_invariant):
    if fp8_ok(out, x, weight, weight_scale) and out.dtype == torch.bfloat16:
        route = _route(out, x, weight, _invariant(batch_invariant))
        if _swiglu(out, gate_up, route, lambda dst, epilogue: _product(
                dst, x, weight, weight_scale, epilogue, NO_XIELU, route)):
            return
    fallback("linear_swiglu", "FP8 layout", out, x, weight, weight_scale, gate_up,
             batch_invariant)


def linear_xielu(out, x, weight, weight_scale, xielu, batch_invariant):
    s = xielu
    params = (s.alpha_p, s.alpha_n, s.beta, s.eps)
    if fp8_ok(out, x, weight, weight_scale) and out.dtype == torch.bfloat16:
        route = _route(out, x, weight, _invariant(batch_invariant))
        if route != "scaled_mm":
            if _product(out, x, weight, weight_scale, "xielu", params, route):
                return
        elif (elementwise.xielu_ok(out, out)
              and _product(out, x, weight, weight_scale, "none", NO_XIELU, route)):
            return elementwise.xielu(out, out, s)
    fallback("linear_xielu", "FP8 layout", out, x, weight, weight_scale, xielu, batch_invariant)


def e4m3_input_ok(out, x_q, x_scale, weight, weight_scale) -> bool:
    """Layouts the e4m3-input ops take: contiguous e4m3 rows (K % 16 == 0) with float32 scales,
    an e4m3 weight with float32 scales, a bf16 out."""
    return (x_q.dim() == 2 and out.dim() == 2 and x_q.dtype == E4M3 and weight.dtype == E4M3
            and x_scale.dtype == torch.float32 and x_scale.shape == x_q.shape[:1]
            and weight_scale is not None and weight_scale.dtype == torch.float32
            and out.dtype == torch.bfloat16 and x_q.shape[1] % 16 == 0
            and contig(x_q, x_scale, weight, weight_scale, out) and aligned(x_q, weight))


def linear_e4m3_input(out, x_q, x_scale, weight, weight_scale, batch_invariant):
    if e4m3_input_ok(out, x_q, x_scale, weight, weight_scale):
        route = _route(out, x_q, weight, _invariant(batch_invariant))
        _given_product(out, x_q, x_scale, weight, weight_scale, "none", NO_XIELU, route)
        return
    fallback("linear_e4m3_input", "FP8 layout", out, x_q, x_scale, weight, weight_scale,
             batch_invariant)


def linear_swiglu_e4m3_input(out, x_q, x_scale, weight, weight_scale, gate_up, batch_invariant):
    if e4m3_input_ok(out, x_q, x_scale, weight, weight_scale):
        route = _route(out, x_q, weight, _invariant(batch_invariant))
        if _swiglu(out, gate_up, route, lambda dst, epilogue: _given_product(
                dst, x_q, x_scale, weight, weight_scale, epilogue, NO_XIELU, route)):
            return
    fallback("linear_swiglu_e4m3_input", "FP8 layout", out, x_q, x_scale, weight, weight_scale,
             gate_up, batch_invariant)


def _invariant(batch_invariant) -> bool:
    """Whether every row must be the same bits at any row count: a batch-invariant step. (A
    single sequence's steps, batch_invariant True, have at most INVARIANT_MAX_ROWS rows where it
    matters, and those always take gemv.cu's fixed configuration.)"""
    return batch_invariant == Invariance.BATCH
