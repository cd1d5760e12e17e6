"""Conformance: the linear ops with e4m3 weights (``tileinfer.backend.fp8``), for a backend whose
``BackendInfo`` declares ``fp8`` (others skip these tests and still pass the rest).

Each product is held to ref's values: the input quantized per row and the float32 sum of exact
e4m3 products, scaled, rounded once (other backends differ only in the order of the sum). Rows
of single-sequence steps are the same bits as alone; with ``BackendInfo.batch_invariant``, rows
of steps of any size as well."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backend.hookspecs import INVARIANT_MAX_ROWS, Invariance

from .helpers import assert_close, make_fp8_weight, rand, run_linear_op

# (n, in_features, out_features): decode, verify, the batched GEMV's widths, past 64 rows (the
# tensor-core GEMM), SmolLM2-135M's and llama3-8b's widths.
SHAPES = [(1, 64, 96), (3, 256, 512), (8, 576, 1536), (17, 96, 64), (64, 256, 384),
          (65, 256, 384), (200, 576, 960), (1, 4096, 1024), (5, 1536, 576)]
MLP_SHAPES = [(1, 64, 96), (9, 128, 256), (64, 576, 1536), (100, 128, 256)]


@pytest.fixture
def fp8_ops(ops):
    if not ops.backend.info.fp8:
        pytest.skip(f"backend {ops.name!r} does not declare FP8 linear ops")
    return ops


@pytest.mark.parametrize("invariant", [True, False], ids=["steps", "batched"])
@pytest.mark.parametrize("n,in_f,out_f", SHAPES)
def test_fp8_linear(fp8_ops, ref, device, n, in_f, out_f, invariant):
    gen = torch.Generator().manual_seed(n + in_f)
    x = rand((n, in_f), torch.bfloat16, device, 1.0, gen)
    w, scale = make_fp8_weight(out_f, in_f, device, gen)
    assert_close(run_linear_op(fp8_ops, "linear", x, w, scale, out_f, invariant),
                 run_linear_op(ref, "linear", x, w, scale, out_f, True))


@pytest.mark.parametrize("op", ["linear_swiglu", "linear_xielu"])
@pytest.mark.parametrize("invariant", [True, False], ids=["steps", "batched"])
@pytest.mark.parametrize("n,in_f,inter", MLP_SHAPES)
def test_fp8_mlp(fp8_ops, ref, device, op, n, in_f, inter, invariant):
    gen = torch.Generator().manual_seed(n + in_f + inter)
    x = rand((n, in_f), torch.bfloat16, device, 1.0, gen)
    w, scale = make_fp8_weight(2 * inter if op == "linear_swiglu" else inter, in_f, device, gen)
    assert_close(run_linear_op(fp8_ops, op, x, w, scale, inter, invariant),
                 run_linear_op(ref, op, x, w, scale, inter, True))


def test_fp8_rows_of_outliers_and_zeros(fp8_ops, ref, device):
    """Per-row scales: a row of large values beside a row of small ones and an all-zero row
    (scale 1, output 0): each row is quantized on its own."""
    x = rand((4, 256), torch.bfloat16, "cpu")
    x[0] *= 1000.0
    x[1] *= 1e-3
    x[2] = 0.0
    x[3, 7] = 300.0  # one outlier sets the row's scale
    x = x.to(device)
    w, scale = make_fp8_weight(128, 256, device)
    out = run_linear_op(fp8_ops, "linear", x, w, scale, 128, True)
    assert_close(out, run_linear_op(ref, "linear", x, w, scale, 128, True))
    assert torch.equal(out[2].cpu(), torch.zeros(128, dtype=torch.bfloat16))


@pytest.mark.parametrize("op", ["linear", "linear_swiglu", "linear_xielu"])
def test_fp8_step_rows_are_the_same_as_alone(fp8_ops, device, op):
    """batch_invariant=True: rows of steps of up to INVARIANT_MAX_ROWS rows, bit for bit."""
    in_f, out_f = 576, 320
    x = rand((INVARIANT_MAX_ROWS, in_f), torch.bfloat16, device)
    w, scale = make_fp8_weight(2 * out_f if op == "linear_swiglu" else out_f, in_f, device)
    alone = torch.cat([run_linear_op(fp8_ops, op, x[i:i + 1].clone(), w, scale, out_f, True)
                       for i in range(INVARIANT_MAX_ROWS)])
    for n in (2, 5, INVARIANT_MAX_ROWS):
        step = run_linear_op(fp8_ops, op, x[:n].clone(), w, scale, out_f, True)
        assert torch.equal(step, alone[:n]), \
            f"{op}: rows of a {n}-row step differ from the same rows alone"


@pytest.mark.parametrize("op", ["linear", "linear_swiglu", "linear_xielu"])
def test_fp8_rows_are_the_same_in_steps_of_any_size(fp8_ops, device, op):
    """Invariance.BATCH (a backend that declares batch_invariant): rows of steps of 1..256 rows."""
    if not fp8_ops.backend.info.batch_invariant:
        pytest.skip(f"backend {fp8_ops.name!r} does not declare batch-invariant ops")
    in_f, out_f = 576, 160
    x = rand((256, in_f), torch.bfloat16, device)
    w, scale = make_fp8_weight(2 * out_f if op == "linear_swiglu" else out_f, in_f, device)
    probes = (0, 5, 100, 255)
    alone = {i: run_linear_op(fp8_ops, op, x[i:i + 1].clone(), w, scale, out_f, Invariance.BATCH)
             for i in probes}
    for n in (2, 7, 17, 65, 256):
        index = (torch.arange(n) * 37 + n) % 256
        index[n // 2] = probes[n % len(probes)]
        out = run_linear_op(fp8_ops, op, x[index.to(x.device)].clone(), w, scale, out_f,
                            Invariance.BATCH)
        for place, row in enumerate(index.tolist()):
            if row in alone:
                assert torch.equal(out[place:place + 1], alone[row]), \
                    f"{op}: row {row} at place {place} of a {n}-row step differs from it alone"
