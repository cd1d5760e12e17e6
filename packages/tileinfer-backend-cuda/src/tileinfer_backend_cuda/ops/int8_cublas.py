"""INT8 weights (and e4m3 bits, the weight-only FP8 product: common.one_byte) in products of many
rows (prefill chunks) on cuBLAS: the weight is converted to bf16 a chunk of output rows at a time
(an int8 or e4m3 value is a bf16 value exactly; the row's scale waits for the sum), multiplied
on cuBLAS's tensor cores into float32 sums, and each sum times its row's scale is rounded once
into the output: the product ref defines (the float32 sum times the scale). gemm.cu, the
sm80-style tiling that takes the smaller ones, runs these at a fraction of cuBLAS's rate on
Hopper, which held back INT8 prefill and so the served time to first token
(benchmarks/RESULTS.md, 2026-12-07 (evening), "Served quantized weights" and "INT8 prefill on
cuBLAS")."""

from __future__ import annotations

import torch

from . import elementwise
from .common import one_byte
from .cublas import MM_FLOAT32_OUT, cublas
from .tuning import experiments

# The fewest rows of an INT8 product that runs here (fewer: gemm.cu, which reads the int8 weight
# once; at this count a layer's four products already take less than half of gemm.cu's time,
# though gate/up's conversion alone still costs more than gemm.cu's product).
MIN_ROWS = 128
# The bf16 copy of the weight is made CHUNK_BYTES at most at a time (a temporary), so that a
# prefill needs no more free memory than a fraction of one layer's weight; in chunks of a
# multiple of CHUNK_ALIGN rows (the float32 sums' rows then stay aligned for cuBLAS's fast
# kernels; a chunk of an odd row count ran far slower than the whole weight: RESULTS.md, ibid.).
CHUNK_BYTES = 64 << 20
CHUNK_ALIGN = 128


def min_rows() -> int:
    asked = experiments["int8_cublas_min_rows"]
    return MIN_ROWS if asked is None else int(asked)


def takes(out, x, weight) -> bool:
    """Whether int8_cublas runs this product (gemv_ok's layouts): a one-byte weight, bf16 x, a
    bf16 or float32 out, at least min_rows() rows."""
    return (MM_FLOAT32_OUT and one_byte(weight) and x.dtype == torch.bfloat16
            and out.dtype in (torch.bfloat16, torch.float32) and x.shape[0] >= min_rows())


def int8_cublas(out, x, weight, weight_scale):
    """out (n, O) = (x @ W.T in float32) * weight_scale, rounded to out's dtype."""
    o_rows, k_dim = weight.shape
    chunk = max(CHUNK_ALIGN, CHUNK_BYTES // (2 * k_dim) // CHUNK_ALIGN * CHUNK_ALIGN)
    for start in range(0, o_rows, chunk):
        stop = min(o_rows, start + chunk)
        part = weight[start:stop]
        w16 = torch.empty(part.shape, dtype=torch.bfloat16, device=part.device)
        if elementwise.weight8_to_bf16_ok(w16, part):
            elementwise.weight8_to_bf16(w16, part)  # at a bandwidth PyTorch's cast does not reach
        elif part.dtype == torch.uint8:
            w16.copy_(part.view(torch.float8_e4m3fn))
        else:
            w16.copy_(part)
        sums = torch.empty(x.shape[0], stop - start, dtype=torch.float32, device=x.device)
        cublas(sums, x, w16, out_dtype=torch.float32)
        torch.mul(sums, weight_scale[start:stop], out=out[:, start:stop])
