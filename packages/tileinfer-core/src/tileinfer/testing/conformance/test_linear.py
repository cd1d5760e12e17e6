"""Conformance: linear, linear_swiglu, linear_xielu (float and INT8 weights)."""

from __future__ import annotations

import pytest
import torch

from .helpers import XIELU, assert_close, assert_float32_sums_close, make_weight, poisoned, rand

LINEAR_SHAPES = [(1, 64, 96), (3, 136, 200), (8, 256, 512), (17, 96, 64), (64, 256, 384),
                 (1, 576, 1536), (5, 1536, 576)]  # SmolLM2-135M's hidden 576 / intermediate 1536
MLP_SHAPES = [(1, 64, 96), (4, 136, 200), (37, 128, 256)]  # n, in_features, intermediate


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,in_f,out_f", LINEAR_SHAPES)
def test_linear(ops, ref, device, int8, out_dtype, n, in_f, out_f):
    x = rand((n, in_f), torch.bfloat16, device)
    w, scale = make_weight(out_f, in_f, device, int8)
    out, expected = poisoned((n, out_f), out_dtype, device), poisoned((n, out_f), out_dtype, device)
    ops.linear(out, x, w, scale)
    ref.linear(expected, x, w, scale)
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
    ops.linear(out, x, w, None)
    ref.linear(expected, x, w, None)
    assert_close(out, expected, dtype=torch.float16)  # TF32 or reordered sums: a little looser


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("n,in_f,inter", MLP_SHAPES)
def test_linear_swiglu(ops, ref, device, int8, n, in_f, inter):
    x = rand((n, in_f), torch.bfloat16, device)
    w, scale = make_weight(2 * inter, in_f, device, int8)
    out = poisoned((n, inter), torch.bfloat16, device)
    expected = poisoned((n, inter), torch.bfloat16, device)
    scratch = poisoned((n, 2 * inter), torch.bfloat16, device)
    ops.linear_swiglu(out, x, w, scale, scratch)
    ref.linear_swiglu(expected, x, w, scale, scratch.clone())
    assert_close(out, expected)


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("n,in_f,inter", MLP_SHAPES)
def test_linear_xielu(ops, ref, device, int8, n, in_f, inter):
    x = rand((n, in_f), torch.bfloat16, device)
    w, scale = make_weight(inter, in_f, device, int8)
    out = poisoned((n, inter), torch.bfloat16, device)
    expected = poisoned((n, inter), torch.bfloat16, device)
    ops.linear_xielu(out, x, w, scale, XIELU)
    ref.linear_xielu(expected, x, w, scale, XIELU)
    assert_close(out, expected)
