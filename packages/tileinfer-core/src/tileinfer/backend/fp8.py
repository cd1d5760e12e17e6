"""FP8 (e4m3) linear products: what the linear ops compute for a float8 weight.

A weight W (out, in) is stored as e4m3 values ``q`` with one float32 scale per output row,
``W[j] ~= w_scale[j] * q[j]`` (``tileinfer.model.quant.quantize_fp8``). The activations are
quantized the same way, per token row, when the product runs (dynamic per-token scales, as
llm-compressor's FP8_DYNAMIC scheme and vLLM's fp8 method do):

    x_scale[i] = max|x[i]| / 448            (1 for an all-zero row)
    xq[i]      = e4m3(clamp(x[i] / x_scale[i], -448, 448))   (round to nearest even)
    out[i, j]  = (sum_k xq[i, k] * q[j, k]) * x_scale[i] * w_scale[j]

Both divisions are IEEE float32 divisions (correctly rounded): an element near a boundary of
e4m3's rounding lands on the same side in every backend only if its quotient has the same last
bit. (PyTorch divides a GPU tensor by a Python number as a multiplication by its reciprocal,
which can differ in that bit, hence the tensor divisor below. A power-of-two scale would make
the division exact, but pushes the small elements of rows with outliers, common in activations,
into e4m3's subnormals: measurably more KL divergence on SmolLM2-135M, benchmarks/RESULTS.md.)

A product of two e4m3 values is exact in float32 (4 + 4 significant bits), so backends differ
only in the order of the float32 sum; the result is rounded once, to out's dtype. Both operands
in e4m3 is what lets batched steps run on FP8 tensor cores, and a row's quantization depends on
that row alone, so the rows of a step stay independent of each other (batch invariance).

Weight-only: a weight given as uint8 holds the bit patterns of e4m3 values ``q`` (with the
same row scales), and x is not quantized:

    out[i, j]  = (sum_k x[i, k] * e4m3(q[j, k])) * w_scale[j]

the INT8 product with e4m3 values in place of integers. A bf16 value times an e4m3 value is
exact in float32 (8 + 4 significant bits), so again backends differ only in the sum's order.
"""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # the largest finite e4m3 value


def row_scales(x: torch.Tensor) -> torch.Tensor:
    """Per-row scales (n,) float32 of x (n, k): max|x[i]| / 448, or 1 for an all-zero row."""
    amax = x.float().abs().amax(dim=-1)
    return torch.where(amax > 0, amax / torch.full_like(amax, E4M3_MAX), torch.ones_like(amax))


def quantize_rows(x: torch.Tensor, scale: torch.Tensor | None = None):
    """(xq, scale): x (n, k) as e4m3 values per row and the float32 scales (n,) (row_scales(x)
    unless given), so that ``x[i] ~= scale[i] * xq[i]``."""
    if scale is None:
        scale = row_scales(x)
    q = torch.clamp(x.float() / scale[:, None], -E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def e4m3_values(bits: torch.Tensor) -> torch.Tensor:
    """The float32 values of e4m3 bit patterns (uint8, any shape)."""
    return bits.view(E4M3).float()


def fp8_matmul(x: torch.Tensor, q: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """The float32 result (n, out) of the FP8 product above, for x (n, k) in any float dtype."""
    xq, x_scale = quantize_rows(x)
    return fp8_matmul_quantized(xq, x_scale, q, w_scale)


def fp8_matmul_quantized(xq: torch.Tensor, x_scale: torch.Tensor, q: torch.Tensor,
                         w_scale: torch.Tensor) -> torch.Tensor:
    """fp8_matmul for an input given quantized: xq (n, k) e4m3 values (any float dtype that
    holds them), x_scale (n,) float32."""
    return (xq.float() @ q.float().T) * x_scale[:, None] * w_scale.float()[None, :]


def fp8_weight_only_matmul(x: torch.Tensor, bits: torch.Tensor,
                           w_scale: torch.Tensor) -> torch.Tensor:
    """The float32 result (n, out) of the weight-only product above (bits: uint8 (out, k))."""
    return (x.float() @ e4m3_values(bits).T) * w_scale.float()[None, :]
