"""Conformance: embed, rmsnorm, add_rmsnorm, and the optional gemma_rmsnorm and
add_gemma_rmsnorm (against transformers' Gemma3RMSNorm, written out here)."""

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


def _gemma_norm(x, weight, eps, dtype):
    """transformers' Gemma3RMSNorm in float32, rounded once: the definition."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight).to(dtype)


def _needs(ops, op):
    if getattr(ops, op) is None:
        pytest.skip(f"{op} is optional and this backend does not implement it")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (5, 1152), (17, 4, 256), (3, 640)])
def test_gemma_rmsnorm(ops, device, dtype, shape):
    _needs(ops, "gemma_rmsnorm")
    x = rand(shape, dtype, device, 3.0)
    w = rand(shape[-1:], torch.float32, device) + 1  # 1 + w in float32, as Gemma's are loaded
    out = poisoned(shape, dtype, device)
    ops.gemma_rmsnorm(out, x, w, 1e-6)
    assert_close(out, _gemma_norm(x, w, 1e-6, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma_rmsnorm_in_place_on_head_views(ops, device, dtype):
    """The q heads of a fused qkv row, normed in place (out is x, a strided view)."""
    _needs(ops, "gemma_rmsnorm")
    n, heads, kv_heads, head_dim = 3, 4, 1, 128
    qkv = rand((n, (heads + 2 * kv_heads) * head_dim), dtype, device, 3.0)
    before = qkv.clone()
    w = rand((head_dim,), torch.float32, device) + 1
    q = qkv.view(n, heads + 2 * kv_heads, head_dim)[:, :heads]
    ops.gemma_rmsnorm(q, q, w, 1e-6)
    expected = _gemma_norm(before.view(n, -1, head_dim)[:, :heads], w, 1e-6, dtype)
    assert_close(q, expected)
    assert torch.equal(qkv[:, heads * head_dim:].cpu(), before[:, heads * head_dim:].cpu()), \
        "the k and v parts must stay as they were"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,hidden", [(1, 64), (6, 1152)])
def test_add_gemma_rmsnorm(ops, device, dtype, n, hidden):
    _needs(ops, "add_gemma_rmsnorm")
    res, delta = rand((n, hidden), dtype, device), rand((n, hidden), dtype, device)
    w = rand((hidden,), torch.float32, device) + 1
    expected_res = (res.float() + delta.float()).to(dtype)
    out = poisoned((n, hidden), dtype, device)
    ops.add_gemma_rmsnorm(res, out, delta, w, 1e-6)
    assert torch.equal(res.cpu(), expected_res.cpu()), "residual + delta, rounded once"
    assert_close(out, _gemma_norm(expected_res, w, 1e-6, dtype))
