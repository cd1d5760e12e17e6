"""Norms, matrix products and the MLP activations of the ref backend, as functions that return
new tensors. The ops in ``__init__`` copy their results into the outputs they are given, one
row at a time in short steps (``row_slices``).

``silu_mul`` and ``xielu`` are not ops of the contract: ``linear_swiglu`` and ``linear_xielu``
use them (and other backends' tests compare their own activation kernels with them).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from tileinfer.backend.fp8 import E4M3, fp8_matmul, fp8_weight_only_matmul


# Steps of 2..ROW_INVARIANT_MAX_TOKENS token rows (speculative verify steps, small batches)
# compute every row on its own, exactly as a 1-token step computes it: a matrix product or a
# reduction over several rows may sum in another order than over one (MKL and cuBLAS pick other
# kernels for one row), and ref's verify rows must round like its decode steps so that greedy
# speculative output equals plain greedy output. Longer steps (prefill) take whole-tensor ops.
ROW_INVARIANT_MAX_TOKENS = 32


def row_slices(n: int) -> list[slice]:
    """The row ranges of an n-row step that are computed separately."""
    if 1 < n <= ROW_INVARIANT_MAX_TOKENS:
        return [slice(i, i + 1) for i in range(n)]
    return [slice(0, n)]


def rows_of(x, invariant: bool = False):
    """(row range, input) pairs of x, computed separately: a row is copied to a tensor of its
    own, aligned as a 1-token step's buffer is (GPU kernels may pick another code path, with
    another summation order, for a pointer into the middle of a tensor). invariant (the
    batch-invariant mode): blocks of ROW_BLOCK rows at any row count (``row_blocks``)."""
    if invariant:
        return row_blocks(x)
    slices = row_slices(x.shape[0])
    if len(slices) == 1:
        return [(slices[0], x)]
    return [(r, x[r].clone()) for r in slices]


# Batch-invariant steps (and every norm) compute their rows in blocks of this many, the last one
# padded with zeros: every product or reduction then has the same shape whatever the step
# holds, so the library runs the same kernel, and a row's sum does not depend on the other rows
# or its place among them (a kernel sums every row of its tile alike).
ROW_BLOCK = 32


def row_blocks(x):
    """(row range, block) pairs covering x's rows: blocks of exactly ROW_BLOCK rows, the last
    one a zero-padded copy (its range says which rows are real)."""
    n = x.shape[0]
    blocks = []
    for start in range(0, max(n, 1), ROW_BLOCK):
        stop = min(n, start + ROW_BLOCK)
        block = x.new_zeros((ROW_BLOCK,) + tuple(x.shape[1:]))
        block[: stop - start] = x[start:stop]
        blocks.append((slice(start, stop), block))
    return blocks


def quantized_rows(x_q, x_scale, invariant: bool = False):
    """rows_of for an input given as its e4m3 rows x_q (n, k) and scales x_scale (n,): (row
    range, the rows' values as float32, their scales), the ranges and shapes rows_of(x) has
    (padding rows hold zeros, as a padded x's quantized rows would)."""
    values, scales = rows_of(x_q.float(), invariant), rows_of(x_scale, invariant)
    return [(r, q, s) for (r, q), (_, s) in zip(values, scales)]


def rms(x, weight, eps, out_dtype):
    """transformers' LlamaRMSNorm: ``x * rsqrt(mean(x^2) + eps)`` in float32 rounded to x's dtype,
    then ``weight * x_hat`` rounded to out_dtype."""
    xf = x.float()
    x_hat = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight.to(out_dtype) * x_hat.to(out_dtype)).to(out_dtype)


# Float32 copies of float weights that a float32 product reads (the lm_head of a bf16 model),
# made once per weight (and again if it is modified in place): on a CPU converting a large
# lm_head costs more than the product itself.
# id(weight) -> (weak reference to weight, its version, the float32 copy); an entry goes with
# its weight (tensors hash by identity but compare elementwise, so no WeakKeyDictionary).
_FLOAT32_COPIES: dict[int, tuple] = {}


def float32_weight(weight):
    """weight as float32 (itself if it is float32), cached per weight tensor."""
    if weight.dtype == torch.float32:
        return weight
    key = id(weight)
    entry = _FLOAT32_COPIES.get(key)
    if entry is None or entry[0]() is not weight or entry[1] != weight._version:
        ref = weakref.ref(weight, lambda _, key=key: _FLOAT32_COPIES.pop(key, None))
        entry = (ref, weight._version, weight.float())
        _FLOAT32_COPIES[key] = entry
    return entry[2]


def matmul(x, weight, weight_scale, out_dtype=None):
    """``x @ W.T`` with float32 accumulation, for a float weight or an INT8 or e4m3 weight with
    per-output-channel scales. Float weight: rounded to x's dtype (F.linear, as transformers),
    unless out_dtype is float32: then the float32 sum of the exact products, unrounded. INT8
    weight: the scaled float32 sum. e4m3 weight: the float32 FP8 product of
    ``tileinfer.backend.fp8`` (x quantized per row as well); e4m3 bits (uint8): its weight-only
    product."""
    if weight_scale is None:
        if out_dtype == torch.float32 and x.dtype != torch.float32:
            return F.linear(x.float(), float32_weight(weight))
        return F.linear(x, weight)
    if weight.dtype == E4M3:
        return fp8_matmul(x, weight, weight_scale)
    if weight.dtype == torch.uint8:
        return fp8_weight_only_matmul(x, weight, weight_scale)
    return F.linear(x.float(), weight.float()) * weight_scale.float()


def silu_mul(gate, up, dtype):
    """transformers' ``act_fn(gate) * up``: silu(gate) rounded to dtype, then the product."""
    act = F.silu(gate.float()).to(dtype)
    return (act.float() * up.float()).to(dtype)


def xielu(x, scalars):
    """xIELU (arXiv:2411.13010) in float32; scalars: an ``XIELUScalars``."""
    xf = x.float()
    pos = scalars.alpha_p * xf * xf + scalars.beta * xf
    neg = (torch.expm1(torch.clamp(xf, max=scalars.eps)) - xf) * scalars.alpha_n + scalars.beta * xf
    return torch.where(xf > 0, pos, neg)
