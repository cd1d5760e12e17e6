"""norm.cu: RMSNorm and the fused residual add + RMSNorm, a warp per row up to 1024 elements
(q/k head norms, small hidden sizes), a block per row above; Gemma's (GEMMA: a float32 weight,
one rounding), on a contiguous copy of a strided view (Gemma's q/k heads inside qkv); the add +
RMSNorm that also writes its rows in e4m3 for an FP8 product (E4M3_OUT)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tileinfer.backend.fp8 import E4M3

from .common import DTYPE_NAMES, aligned, cdiv, contig, dev, fallback, kernel
from .linear_fp8 import quantize_rows_of
from .tuning import pdl


def _launch(op, out, x, delta, weight, eps, gemma=False, e4m3=None):
    """op's kernel on rows of x; e4m3: (out_q, out_scale) of add_rmsnorm_e4m3 (VEC 8)."""
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
    if e4m3 is not None:
        defines["E4M3_OUT"] = 1
    # the kernel's arguments: rmsnorm (out, x, weight), add_rmsnorm (x, out, delta, weight),
    # add_rmsnorm_e4m3 (x, out, out_q, out_scale, delta, weight); then the rows' sizes
    tensors = ((out, x, weight) if op == "rmsnorm" else (x, out) + tuple(e4m3 or ())
               + (delta, weight))
    sig = "p" * len(tensors)
    device = dev(out)
    if dim <= 1024:  # a warp per row
        k = kernel("norm.cu", f"{op}_warp", sig + "qif", device, defines)
        k.launch((cdiv(rows, 8),), (256,), tensors + (rows, dim, eps), pdl=pdl(device))
    else:  # a block per row
        k = kernel("norm.cu", f"{op}_block", sig + "if", device, defines)
        threads = min(512, cdiv(cdiv(dim, vec), 32) * 32)
        k.launch((rows,), (threads,), tensors + (dim, eps), pdl=pdl(device))


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


def add_rmsnorm_e4m3(residual, out, out_q, out_scale, delta, weight, eps):
    n, dim = residual.shape if residual.dim() == 2 else (0, 0)
    if (residual.dim() == 2 and contig(residual, out, delta, weight, out_q, out_scale)
            and residual.dtype == out.dtype == delta.dtype == weight.dtype == torch.bfloat16
            and residual.shape == out.shape == delta.shape == out_q.shape
            and out_q.dtype == E4M3 and out_scale.dtype == torch.float32
            and out_scale.shape == (n,) and dim % 8 == 0
            and aligned(residual, out, delta, weight, out_q)):
        return _launch("add_rmsnorm_e4m3", out, residual, delta, weight, eps,
                       e4m3=(out_q, out_scale))
    # other layouts: the two ops, this backend's norm and its quantization of the norm's rows
    add_rmsnorm(residual, out, delta, weight, eps)
    quantize_rows_of(out, out_q, out_scale)


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
