"""Conformance: the optional e4m3-input ops (``add_rmsnorm_e4m3``, ``linear_e4m3_input``,
``linear_swiglu_e4m3_input``), for a backend that declares ``fp8`` and implements them (others
skip these tests).

Each is held to the backend's own plain ops, bit for bit: the norm writes the residual and
rows that ``add_rmsnorm`` writes, and their quantization as ``tileinfer.backend.fp8`` defines
it; a linear op given the quantized rows of x writes what the plain op writes for x."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backend.fp8 import E4M3, quantize_rows
from tileinfer.backend.hookspecs import Invariance

from .helpers import make_fp8_weight, poisoned, rand, run_linear_op

OPS = ("add_rmsnorm_e4m3", "linear_e4m3_input", "linear_swiglu_e4m3_input")


@pytest.fixture
def e4m3_ops(ops):
    if not ops.backend.info.fp8:
        pytest.skip(f"backend {ops.name!r} does not declare FP8 linear ops")
    missing = [op for op in OPS if getattr(ops, op) is None]
    if missing:
        pytest.skip(f"backend {ops.name!r} does not implement the optional {', '.join(missing)}")
    return ops


def _bits(t):
    return t.view(torch.uint8).cpu() if t.dtype == E4M3 else t.cpu()


# a warp's rows and a block's (hidden up to 1,024 and past it), one and many rows, llama3-8b's
@pytest.mark.parametrize("n,hidden", [(1, 64), (6, 576), (3, 2048), (65, 1024), (2, 4096)])
def test_e4m3_norm_writes_add_rmsnorms_rows_and_their_quantization(e4m3_ops, device, n,
                                                                    hidden):
    gen = torch.Generator().manual_seed(n * hidden)
    res = rand((n, hidden), torch.bfloat16, device, 4.0, gen)
    delta = rand((n, hidden), torch.bfloat16, device, 1.0, gen)
    w = rand((hidden,), torch.bfloat16, device, 1.0, gen) + 1
    res_plain, res_e4m3 = res.clone(), res.clone()
    out_plain = poisoned((n, hidden), torch.bfloat16, device)
    out = poisoned((n, hidden), torch.bfloat16, device)
    out_q = torch.full((n, hidden), 0x7F, dtype=torch.uint8, device=device).view(E4M3)  # NaN
    out_scale = poisoned((n,), torch.float32, device)
    e4m3_ops.add_rmsnorm(res_plain, out_plain, delta, w, 1e-5)
    e4m3_ops.add_rmsnorm_e4m3(res_e4m3, out, out_q, out_scale, delta, w, 1e-5)
    assert torch.equal(res_e4m3.cpu(), res_plain.cpu()), "residual differs from add_rmsnorm's"
    assert torch.equal(out.cpu(), out_plain.cpu()), "out differs from add_rmsnorm's"
    q, scale = quantize_rows(out_plain)
    assert torch.equal(_bits(out_q), _bits(q)), "out_q is not quantize_rows(out)"
    assert torch.equal(out_scale.cpu(), scale.cpu()), "out_scale is not quantize_rows(out)"


def test_e4m3_norm_of_a_zero_row(e4m3_ops, device):
    """An all-zero row (a zero residual and delta) has scale 1 and zero values."""
    hidden = 256
    res = torch.zeros(2, hidden, dtype=torch.bfloat16, device=device)
    res[1] = rand((hidden,), torch.bfloat16, device)
    delta = torch.zeros_like(res)
    w = torch.ones(hidden, dtype=torch.bfloat16, device=device)
    out = poisoned((2, hidden), torch.bfloat16, device)
    out_q = torch.empty(2, hidden, dtype=E4M3, device=device)
    out_scale = poisoned((2,), torch.float32, device)
    e4m3_ops.add_rmsnorm_e4m3(res, out, out_q, out_scale, delta, w, 1e-5)
    assert out_scale[0].item() == 1.0 and not out_q[0].float().any()
    assert out_q[1].float().abs().max().item() == 448.0


def _invariances(ops):
    return [True, False] + ([Invariance.BATCH] if ops.backend.info.batch_invariant else [])


# decode, verify, the batched GEMV's widths, past 64 rows (the tensor-core GEMMs)
@pytest.mark.parametrize("op", ["linear", "linear_swiglu"])
@pytest.mark.parametrize("n,in_f,out_f", [(1, 64, 96), (5, 576, 320), (17, 256, 512),
                                          (64, 256, 384), (65, 256, 384), (72, 576, 160)])
def test_e4m3_input_linear_writes_what_the_plain_op_writes(e4m3_ops, device, op, n, in_f,
                                                           out_f):
    gen = torch.Generator().manual_seed(n + in_f + out_f)
    x = rand((n, in_f), torch.bfloat16, device, 2.0, gen)
    x[0] *= 50.0  # rows of other scales
    w, scale = make_fp8_weight(2 * out_f if op == "linear_swiglu" else out_f, in_f, device, gen)
    x_q, x_scale = quantize_rows(x)
    for invariant in _invariances(e4m3_ops):
        plain = run_linear_op(e4m3_ops, op, x, w, scale, out_f, invariant)
        out = poisoned((n, out_f), torch.bfloat16, device)
        if op == "linear":
            e4m3_ops.linear_e4m3_input(out, x_q, x_scale, w, scale, invariant)
        else:
            gate_up = poisoned((n, 2 * out_f), torch.bfloat16, device)
            e4m3_ops.linear_swiglu_e4m3_input(out, x_q, x_scale, w, scale, gate_up, invariant)
        assert torch.equal(out.cpu(), plain.cpu()), \
            f"{op} of the quantized rows differs from {op} of x ({invariant!r})"
