"""The linear ops of the contract: e4m3 weights go to linear_fp8, the others to linear."""

from __future__ import annotations

from tileinfer.backend.fp8 import E4M3

from . import linear as dense
from . import linear_fp8


def _impl(weight):
    return linear_fp8 if weight.dtype == E4M3 else dense


def linear(out, x, weight, weight_scale, batch_invariant=True):
    _impl(weight).linear(out, x, weight, weight_scale, batch_invariant)


def linear_swiglu(out, x, weight, weight_scale, gate_up, batch_invariant=True):
    _impl(weight).linear_swiglu(out, x, weight, weight_scale, gate_up, batch_invariant)


def linear_xielu(out, x, weight, weight_scale, xielu, batch_invariant=True):
    _impl(weight).linear_xielu(out, x, weight, weight_scale, xielu, batch_invariant)
