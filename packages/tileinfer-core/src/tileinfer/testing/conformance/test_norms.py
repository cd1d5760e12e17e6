"""Conformance: embed, rmsnorm, add_rmsnorm."""

from __future__ import annotations

import pytest
import torch

from .helpers import DTYPES, assert_close, poisoned, rand


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,vocab,hidden", [(1, 100, 64), (7, 333, 96), (33, 1000, 520)])
def test_embed(ops, device, dtype, n, vocab, hidden):
    table = rand((vocab, hidden), dtype, device)
    ids = torch.randint(0, vocab, (n,), dtype=torch.int32).to(device)
    out = poisoned((n, hidden), dtype, device)
    ops.embed(out, table, ids)
    assert torch.equal(out.cpu(), table[ids.long()].cpu()), "embed must copy rows exactly"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (5, 96), (3, 2048), (17, 4, 64), (2, 7, 128), (3, 576)])
def test_rmsnorm(ops, ref, device, dtype, shape):
    x = rand(shape, dtype, device, 3.0)
    w = rand(shape[-1:], dtype, device) + 1
    out, expected = poisoned(shape, dtype, device), poisoned(shape, dtype, device)
    ops.rmsnorm(out, x, w, 1e-5)
    ref.rmsnorm(expected, x, w, 1e-5)
    assert_close(out, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,hidden", [(1, 64), (6, 200), (4, 4096)])
def test_add_rmsnorm(ops, ref, device, dtype, n, hidden):
    res, delta = rand((n, hidden), dtype, device), rand((n, hidden), dtype, device)
    w = rand((hidden,), dtype, device) + 1
    res_a, res_e = res.clone(), res.clone()
    out, expected = poisoned((n, hidden), dtype, device), poisoned((n, hidden), dtype, device)
    ops.add_rmsnorm(res_a, out, delta, w, 1e-6)
    ref.add_rmsnorm(res_e, expected, delta, w, 1e-6)
    assert_close(res_a, res_e, what="residual")
    assert_close(out, expected)
