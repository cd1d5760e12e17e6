"""norm.cu: RMSNorm and the fused residual add + RMSNorm, a warp per row up to 1024 elements
(q/k head norms, small hidden sizes), a block per row above; Gemma's (GEMMA: a float32 weight,
one rounding), on a contiguous copy of a strided view (Gemma's q/k heads inside qkv)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import DTYPE_NAMES, aligned, cdiv, contig, dev, fallback, kernel
from .tuning import pdl


def _launch(op, out, x, delta, weight, eps, gemma=False):
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    if rows == 0:
        return
    # One access moves VEC elements of x and of the weight: 16 bytes of the wider of the two.
    vec = 16 // max(x.element_size(), weight.element_size())
    if dim % vec or not aligned(out, x, delta, weight):
        vec = 1
    defines = {"DTYPE": DTYPE_NAMES[x.dtype], "WEIGHT_DTYPE": DTYPE_NAMES[weight.dtype], "VEC": vec}
    if gemma:
        defines["GEMMA"] = 1
    device = dev(out)
    if dim <= 1024:  # a warp per row
        name, sig = f"{op}_warp", "pppqif" if op == "rmsnorm" else "ppppqif"
        k = kernel("norm.cu", name, sig, device, defines)
        args = ((out, x, weight, rows, dim, eps) if op == "rmsnorm"
                else (x, out, delta, weight, rows, dim, eps))
        k.launch((cdiv(rows, 8),), (256,), args, pdl=pdl(device))
    else:  # a block per row
        name, sig = f"{op}_block", "pppif" if op == "rmsnorm" else "ppppif"
        k = kernel("norm.cu", name, sig, device, defines)
        threads = min(512, cdiv(cdiv(dim, vec), 32) * 32)
        args = (out, x, weight, dim, eps) if op == "rmsnorm" else (x, out, delta, weight, dim, eps)
        k.launch((rows,), (threads,), args, pdl=pdl(device))


def rmsnorm(out, x, weight, eps):
    if not (contig(out, x, weight) and out.dtype == x.dtype and out.shape == x.shape
            and x.dtype in DTYPE_NAMES and weight.dtype in DTYPE_NAMES):
        return fallback("rmsnorm", "layout", out, x, weight, eps)
    _launch("rmsnorm", out, x, None, weight, eps)


def add_rmsnorm(residual, out, delta, weight, eps):
    if not (contig(residual, out, delta, weight) and residual.dtype == out.dtype == delta.dtype
            and residual.shape == out.shape == delta.shape and residual.dtype in DTYPE_NAMES
            and weight.dtype in DTYPE_NAMES):
        return fallback("add_rmsnorm", "layout", residual, out, delta, weight, eps)
    _launch("add_rmsnorm", out, residual, delta, weight, eps)


def _gemma_ok(out, x, weight) -> bool:
    return (contig(out, x, weight) and out.dtype == x.dtype and out.shape == x.shape
            and x.dtype in DTYPE_NAMES and weight.dtype == torch.float32)


def gemma_rmsnorm(out, x, weight, eps):
    if _gemma_ok(out, x, weight):
        _launch("rmsnorm", out, x, None, weight, eps, gemma=True)
    elif (out.shape == x.shape and out.dtype == x.dtype and x.dtype in DTYPE_NAMES
          and weight.dtype == torch.float32 and contig(weight)):
        # A q/k head view of qkv: the same kernel on a contiguous copy (a temporary, as the ref
        # fallback of the rmsnorm ops makes for such views; norm.cu reads rows end to end).
        rows = x.contiguous()
        _launch("rmsnorm", rows, rows, None, weight, eps, gemma=True)
        out.copy_(rows)
    else:  # another dtype or weight: torch's norm, the same float32 math
        out.copy_(F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps))


def add_gemma_rmsnorm(residual, out, delta, weight, eps):
    if not (_gemma_ok(out, residual, weight) and contig(delta) and delta.shape == residual.shape
            and delta.dtype == residual.dtype):
        residual.add_(delta)
        gemma_rmsnorm(out, residual, weight, eps)
        return
    _launch("add_rmsnorm", out, residual, delta, weight, eps, gemma=True)
