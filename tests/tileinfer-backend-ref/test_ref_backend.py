"""The ref backend's own checks.

Its two forms of attention (per sequence on the CPU, padded and sync-free on a GPU) agree on
every case of the conformance suite, with and without a sliding window, in default and
batch-invariant steps, so the conformance run of ref on a GPU checks the padded
form against the per-sequence reading. Its backend-private helpers (RoPE, the KV store, the MLP
activations), which other backends' kernel tests compare with, are checked against plain torch
written out independently here.
"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tileinfer.backend import LayerKV, get_backend
from tileinfer.testing.conformance import (ATTENTION_CASES, CACHE_KINDS, WINDOW_CASES, XIELU,
                                           assert_close, attention_step, fill_paged_step,
                                           rope_tables)
from tileinfer_backend_ref.dense import silu_mul, xielu
from tileinfer_backend_ref.kv import quantize_vectors, rope, store_kv
from tileinfer_backend_ref.paged_attention import attention_padded, attention_per_sequence


@pytest.mark.parametrize("invariant", [False, True], ids=["default", "batch-invariant"])
@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "block"])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=str)
def test_padded_attention_equals_per_sequence(kind, causal, case, invariant):
    q_lens, context_lens, heads, kv_heads, head_dim, page_size = case
    gen = torch.Generator().manual_seed(len(q_lens) + heads)
    q, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, "cpu", gen)
    # Unused pages holding NaN must not leak into the padded form's masked products.
    if cache.k.dtype.is_floating_point:
        used = torch.zeros(cache.k.shape[0], dtype=torch.bool)
        used[table.flatten().long()] = True
        used[table[:, -1].long()] = False  # the padding page
        cache.k[~used] = float("nan")
        cache.v[~used] = float("nan")
    step = attention_step(cu, ctx, table, max(q_lens), table.shape[1] * page_size)
    # batch-invariant steps: the GPU form's rows over fixed chunks of keys
    step = dataclasses.replace(step, batch_invariant=invariant)
    a, b = torch.empty_like(q), torch.empty_like(q)
    attention_per_sequence(a, q, cache.kv, step, head_dim ** -0.5, causal)
    attention_padded(b, q, cache.kv, step, head_dim ** -0.5, causal)
    assert_close(b, a)


@pytest.mark.parametrize("invariant", [False, True], ids=["default", "batch-invariant"])
@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("case", WINDOW_CASES, ids=str)
def test_padded_window_attention_equals_per_sequence(kind, case, invariant):
    q_lens, context_lens, heads, kv_heads, head_dim, page_size, window = case
    gen = torch.Generator().manual_seed(len(q_lens) + window)
    q, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, "cpu", gen)
    step = dataclasses.replace(attention_step(cu, ctx, table, max(q_lens),
                                              table.shape[1] * page_size),
                               batch_invariant=invariant)
    a, b = torch.empty_like(q), torch.empty_like(q)
    attention_per_sequence(a, q, cache.kv, step, head_dim ** -0.5, True, window)
    attention_padded(b, q, cache.kv, step, head_dim ** -0.5, True, window)
    assert_close(b, a)


def test_window_attention_matches_dense_softmax_over_the_window():
    """One sequence in one page: row p sees positions p - window + 1 .. p; a window as long as
    the context is plain causal attention."""
    gen = torch.Generator().manual_seed(1)
    q, cache, cu, ctx, table = fill_paged_step([6], [14], 4, 2, 64, 16, "bf16", "cpu", gen)
    step = attention_step(cu, ctx, table, 6, 16)
    ref = get_backend("ref")
    out = torch.empty_like(q)
    ref.attention_window(out, q, cache.kv, step, 0.125, 4, None)
    page = int(table[0, 0])
    k = cache.k[page, :14].float().repeat_interleave(2, 1)  # (14, heads, hd)
    v = cache.v[page, :14].float().repeat_interleave(2, 1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * 0.125
    own, key = torch.arange(8, 14)[:, None], torch.arange(14)[None, :]  # rows at 8..13
    mask = (key <= own) & (key > own - 4)
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    assert_close(out, torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype))
    plain, wide = torch.empty_like(q), torch.empty_like(q)
    ref.attention(plain, q, cache.kv, step, 0.125, True, None)
    ref.attention_window(wide, q, cache.kv, step, 0.125, 14, None)
    assert torch.equal(plain, wide)


def test_attention_hook_matches_dense_softmax():
    """One sequence in one page, no paging subtleties: the op equals softmax(q k^T) v."""
    gen = torch.Generator().manual_seed(0)
    q, cache, cu, ctx, table = fill_paged_step([3], [10], 4, 2, 64, 16, "bf16", "cpu", gen)
    out = torch.empty_like(q)
    step = attention_step(cu, ctx, table, 3, 16)
    get_backend("ref").attention(out, q, cache.kv, step, 0.125, True, None)
    page = int(table[0, 0])
    k = cache.k[page, :10].float().repeat_interleave(2, 1)  # (10, heads, hd)
    v = cache.v[page, :10].float().repeat_interleave(2, 1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * 0.125
    mask = torch.arange(10)[None, :] <= torch.arange(7, 10)[:, None]  # rows at positions 7..9
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
    assert_close(out, torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype))


def test_rope_rotates_halves():
    cos, sin = rope_tables(32, 8, "cpu")
    x = torch.randn(3, 2, 8)
    pos = torch.tensor([0, 5, 31], dtype=torch.int32)
    y = rope(x, cos, sin, pos)
    assert torch.equal(y[0], x[0])  # position 0: cos 1, sin 0
    for i, p in enumerate(pos.tolist()):
        angle = p / 10000 ** (torch.arange(4, dtype=torch.float64) / 4)
        c, s = angle.cos().float(), angle.sin().float()
        x1, x2 = x[i, :, :4], x[i, :, 4:]
        torch.testing.assert_close(y[i], torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1))
    # A rotation keeps each pair's norm.
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


def test_store_kv_int8_rule():
    """Per-vector INT8: scale max|v| / 127 (1 for a zero vector), keys divided by the smoothing
    factors first; a float cache gets the values themselves."""
    page, kv_heads, hd = 4, 2, 8
    k = torch.randn(3, kv_heads, hd)
    v = torch.randn(3, kv_heads, hd)
    k[1] = 0
    smooth = torch.rand(kv_heads, hd) + 0.5
    slots = torch.tensor([6, 0, 3])
    pools = [torch.zeros(3, page, kv_heads, hd, dtype=torch.int8) for _ in range(2)]
    scales = [torch.zeros(3, page, kv_heads) for _ in range(2)]
    store_kv(LayerKV(pools[0], pools[1], scales[0], scales[1], smooth), k, v, slots)
    for vec, pool, scale in ((k / smooth, pools[0], scales[0]), (v, pools[1], scales[1])):
        s = scale[slots // page, slots % page]
        amax = vec.abs().amax(-1)
        torch.testing.assert_close(s, torch.where(amax > 0, amax / 127, 1.0))
        back = pool[slots // page, slots % page].float() * s[..., None]
        assert (back - vec).abs().max() <= 0.5 * s.max() + 1e-6  # within half a step
    assert scales[0][0, 0].tolist() == [1.0, 1.0]  # slot 0 (page 0, offset 0): the zero key
    q, s = quantize_vectors(torch.tensor([[127.0, -254.0, 1.0]]))
    assert q.tolist() == [[64, -127, 0]] and s.tolist() == [2.0]  # 63.5 rounds half to even
    floats = [torch.zeros(2, page, kv_heads, hd, dtype=torch.bfloat16) for _ in range(2)]
    store_kv(LayerKV(*floats), k, v, torch.tensor([1, 2, 7]))
    assert torch.equal(floats[1][1, 3], v[2].to(torch.bfloat16))


def test_activations():
    gate, up = torch.randn(4, 16), torch.randn(4, 16)
    expected = (F.silu(gate).to(torch.bfloat16).float() * up).to(torch.bfloat16)
    assert torch.equal(silu_mul(gate, up, torch.bfloat16), expected)
    x = torch.linspace(-4, 4, 33)
    y = xielu(x, XIELU)
    pos = x > 0
    torch.testing.assert_close(y[pos], XIELU.alpha_p * x[pos] ** 2 + XIELU.beta * x[pos])
    torch.testing.assert_close(
        y[~pos], (torch.expm1(x[~pos].clamp(max=XIELU.eps)) - x[~pos]) * XIELU.alpha_n
        + XIELU.beta * x[~pos])
