"""Conformance: linear, linear_swiglu, linear_xielu (bf16, INT8 and weight-only e4m3 weights),
for single-sequence steps (``batch_invariant=True``: up to INVARIANT_MAX_ROWS rows, each row the
same bits as alone) and batched steps (``batch_invariant=False``: any kernel, held to ref's
values)."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backend.hookspecs import INVARIANT_MAX_ROWS

from .helpers import (FINITE_E4M3_CODES, WEIGHT_KINDS, XIELU, assert_close,
                      assert_float32_sums_close, make_weight_of, poisoned, rand,
                      skip_without_fp8_weight_only)

LINEAR_SHAPES = [(1, 64, 96), (3, 136, 200), (8, 256, 512), (17, 96, 64), (64, 256, 384),
                 (1, 576, 1536), (5, 1536, 576)]  # SmolLM2-135M's hidden 576 / intermediate 1536
# Batched steps: a few rows to a few hundred (the batched engine's decode and mixed steps).
BATCHED_SHAPES = [(2, 64, 96), (6, 136, 200), (8, 576, 1536), (24, 256, 512), (128, 128, 136)]
MLP_SHAPES = [(1, 64, 96), (4, 136, 200), (37, 128, 256)]  # n, in_features, intermediate
BATCHED_MLP_SHAPES = [(2, 64, 96), (8, 136, 200), (48, 128, 256)]


@pytest.mark.parametrize("weights", WEIGHT_KINDS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,in_f,out_f,invariant",
                         [s + (True,) for s in LINEAR_SHAPES] + [s + (False,) for s in BATCHED_SHAPES])
def test_linear(ops, ref, device, weights, out_dtype, n, in_f, out_f, invariant):
    x = rand((n, in_f), torch.bfloat16, device)
    w, scale = make_weight_of(weights, out_f, in_f, device, ops)
    out, expected = poisoned((n, out_f), out_dtype, device), poisoned((n, out_f), out_dtype, device)
    ops.linear(out, x, w, scale, invariant)
    ref.linear(expected, x, w, scale, True)
    if out_dtype == torch.bfloat16:
        assert_close(out, expected)
        return
    # A float32 out holds the float32 sums themselves (the logits), never rounded to bf16.
    assert_float32_sums_close(out, expected, x, w, scale)
    assert not torch.equal(out, out.to(torch.bfloat16).float()), "float32 out rounded to bf16"


def test_linear_float32_model(ops, ref, device):
    x = rand((5, 72), torch.float32, device)
    w = rand((40, 72), torch.float32, device, 0.1)
    out, expected = poisoned((5, 40), torch.float32, device), poisoned((5, 40), torch.float32, device)
    ops.linear(out, x, w, None, True)
    ref.linear(expected, x, w, None, True)
    assert_close(out, expected, dtype=torch.float16)  # TF32 or reordered sums: a little looser


@pytest.mark.parametrize("weights", WEIGHT_KINDS)
@pytest.mark.parametrize("n,in_f,inter,invariant",
                         [s + (True,) for s in MLP_SHAPES] + [s + (False,) for s in BATCHED_MLP_SHAPES])
def test_linear_swiglu(ops, ref, device, weights, n, in_f, inter, invariant):
    x = rand((n, in_f), torch.bfloat16, device)
    w, scale = make_weight_of(weights, 2 * inter, in_f, device, ops)
    out = poisoned((n, inter), torch.bfloat16, device)
    expected = poisoned((n, inter), torch.bfloat16, device)
    scratch = poisoned((n, 2 * inter), torch.bfloat16, device)
    ops.linear_swiglu(out, x, w, scale, scratch, invariant)
    ref.linear_swiglu(expected, x, w, scale, scratch.clone(), True)
    assert_close(out, expected)


@pytest.mark.parametrize("weights", WEIGHT_KINDS)
@pytest.mark.parametrize("n,in_f,inter,invariant",
                         [s + (True,) for s in MLP_SHAPES] + [s + (False,) for s in BATCHED_MLP_SHAPES])
def test_linear_xielu(ops, ref, device, weights, n, in_f, inter, invariant):
    x = rand((n, in_f), torch.bfloat16, device)
    w, scale = make_weight_of(weights, inter, in_f, device, ops)
    out = poisoned((n, inter), torch.bfloat16, device)
    expected = poisoned((n, inter), torch.bfloat16, device)
    ops.linear_xielu(out, x, w, scale, XIELU, invariant)
    ref.linear_xielu(expected, x, w, scale, XIELU, True)
    assert_close(out, expected)


@pytest.mark.parametrize("weights", WEIGHT_KINDS)
@pytest.mark.parametrize("op", ["linear", "linear_logits", "linear_swiglu", "linear_xielu"])
def test_batch_invariant_rows(ops, device, weights, op):
    """batch_invariant=True: every row of a step of 2..INVARIANT_MAX_ROWS rows is the same bits as
    that row run alone (what greedy speculative decoding relies on)."""
    in_f, out_f = 256, 320
    x = rand((INVARIANT_MAX_ROWS, in_f), torch.bfloat16, device)
    rows = 2 * out_f if op == "linear_swiglu" else out_f
    w, scale = make_weight_of(weights, rows, in_f, device, ops)
    dtype = torch.float32 if op == "linear_logits" else torch.bfloat16

    def run(rows):
        n = rows.shape[0]
        out = poisoned((n, out_f), dtype, device)
        if op == "linear_swiglu":
            ops.linear_swiglu(out, rows, w, scale, poisoned((n, 2 * out_f), dtype, device), True)
        elif op == "linear_xielu":
            ops.linear_xielu(out, rows, w, scale, XIELU, True)
        else:
            ops.linear(out, rows, w, scale, True)
        return out

    alone = torch.cat([run(x[i:i + 1].clone()) for i in range(INVARIANT_MAX_ROWS)])
    for n in (2, 5, INVARIANT_MAX_ROWS):
        together = run(x[:n].clone())
        assert torch.equal(together, alone[:n]), \
            f"{op}: rows of a {n}-row step differ from the same rows alone"


@pytest.mark.parametrize("n,invariant", [(1, True), (5, True), (5, False), (40, False),
                                         (200, False)])
def test_e4m3_weight_only_reads_every_value(ops, ref, device, n, invariant):
    """Weight-only e4m3: every finite bit pattern (subnormals and -0 included) in every row, at
    the row counts of decode, verify, batched steps and prefill."""
    codes = torch.tensor(FINITE_E4M3_CODES + [0, 0x80])  # 256
    gen = torch.Generator().manual_seed(n)
    bits = torch.stack([codes[torch.randperm(256, generator=gen)] for _ in range(48)])
    w = bits.to(torch.uint8).to(device)
    scale = (torch.rand(48, generator=gen) * 0.01 + 1e-3).to(device)
    skip_without_fp8_weight_only(ops)
    x = rand((n, 256), torch.bfloat16, device, 1.0, gen)
    out = poisoned((n, 48), torch.bfloat16, device)
    expected = poisoned((n, 48), torch.bfloat16, device)
    ops.linear(out, x, w, scale, invariant)
    ref.linear(expected, x, w, scale, True)
    assert_close(out, expected)
