"""Norms, matrix products and the MLP activations of the ref backend, as functions that return
new tensors. The ops in ``__init__`` copy their results into the outputs they are given.

``silu_mul`` and ``xielu`` are not ops of the contract: ``linear_swiglu`` and ``linear_xielu``
use them (and other backends' tests compare their own activation kernels with them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms(x, weight, eps, out_dtype):
    """transformers' LlamaRMSNorm: ``x * rsqrt(mean(x^2) + eps)`` in float32 rounded to x's dtype,
    then ``weight * x_hat`` rounded to out_dtype."""
    xf = x.float()
    x_hat = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight.to(out_dtype) * x_hat.to(out_dtype)).to(out_dtype)


def matmul(x, weight, weight_scale):
    """``x @ W.T`` for a float weight (F.linear: x's dtype, float32 accumulation, as
    transformers) or an INT8 weight with per-output-channel scales (float32)."""
    if weight_scale is None:
        return F.linear(x, weight)
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
