"""Conformance: attention_inputs (q/k norms, RoPE and the KV store, bf16 and INT8 pages),
attention with its attention_workspace, attention_window (a sliding window; a backend that
leaves it out runs ref's), and the optional attention_with_inputs."""

from __future__ import annotations

import math

import pytest
import torch

from .helpers import (ATTENTION_CASES, CACHE_KINDS, WINDOW_CASES, Cache, assert_cache_equal,
                      assert_close, attention_step, decode_step_inputs, fill_paged_step,
                      poisoned, qk_transform, rand)

ATTN_INPUT_SHAPES = [  # n, heads, kv_heads, head_dim
    (1, 4, 4, 64), (5, 8, 2, 128), (19, 8, 1, 64),
    (3, 9, 3, 64),  # GQA 3 (SmolLM2-135M)
]


def _case_id(c):
    return f"q{c[0]}-ctx{c[1]}-h{c[2]}/{c[3]}-d{c[4]}-p{c[5]}"


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qknorm"])
@pytest.mark.parametrize("n,heads,kv_heads,head_dim", ATTN_INPUT_SHAPES)
def test_attention_inputs(ops, ref, device, kind, qk_norm, n, heads, kv_heads, head_dim):
    """One sequence's n new tokens at positions 7.. in shuffled pages; an all-zero key and value
    (INT8 scale 1) among them."""
    page_size, start = 16, 7
    gen = torch.Generator().manual_seed(n * 100 + heads + kv_heads)
    pages = math.ceil((start + n) / page_size)
    num_pages = pages + 3
    table = torch.randperm(num_pages, generator=gen)[:pages].to(torch.int32)[None]
    positions = torch.arange(start, start + n, dtype=torch.int32)
    slots = table[0, positions // page_size].long() * page_size + positions % page_size
    cache = Cache(num_pages, page_size, kv_heads, head_dim, kind, device)
    expected = cache.clone()
    qkv = rand((n, (heads + 2 * kv_heads) * head_dim), torch.bfloat16, device, 1.0, gen)
    qkv[0, heads * head_dim:] = 0  # the first token's keys and values: all zero
    qk = qk_transform(head_dim, 256, device, qk_norm, gen)
    cu = torch.tensor([0, n], dtype=torch.int32, device=device)
    ctx = torch.tensor([start + n], dtype=torch.int32, device=device)
    step = attention_step(cu, ctx, table.to(device), n, start + n, positions.to(device),
                          slots.to(device))
    q_out = poisoned((n, heads, head_dim), torch.bfloat16, device)
    q_exp = poisoned((n, heads, head_dim), torch.bfloat16, device)
    ops.attention_inputs(q_out, cache.kv, qkv, qk, step)
    ref.attention_inputs(q_exp, expected.kv, qkv, qk, step)
    assert_close(q_out, q_exp, what="queries")
    assert_cache_equal(cache, expected, slots, page_size)


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "block"])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=_case_id)
def test_attention(ops, ref, device, kind, causal, case):
    """attention over pages filled beforehand, with the workspace from attention_workspace."""
    q_lens, context_lens, heads, kv_heads, head_dim, page_size = case
    gen = torch.Generator().manual_seed(sum(context_lens) + heads)
    q, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, device, gen)
    scale = head_dim ** -0.5
    step = attention_step(cu, ctx, table, max(q_lens), table.shape[1] * page_size)
    out, expected = poisoned(q.shape, q.dtype, device), poisoned(q.shape, q.dtype, device)
    ws = ops.attention_workspace(q.shape[0], heads, head_dim, step.max_context_len, q.device)
    ops.attention(out, q, cache.kv, step, scale, causal, ws)
    ref.attention(expected, q, cache.kv, step, scale, causal, None)
    assert_close(out, expected)


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("case", WINDOW_CASES, ids=str)
def test_attention_window(ops, ref, device, kind, case):
    """attention_window over pages filled beforehand: each row sees the last `window`
    positions up to its own."""
    q_lens, context_lens, heads, kv_heads, head_dim, page_size, window = case
    gen = torch.Generator().manual_seed(sum(context_lens) + window)
    q, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, device, gen)
    step = attention_step(cu, ctx, table, max(q_lens), table.shape[1] * page_size)
    out, expected = poisoned(q.shape, q.dtype, device), poisoned(q.shape, q.dtype, device)
    ws = ops.attention_workspace(q.shape[0], heads, head_dim, step.max_context_len, q.device)
    ops.attention_window(out, q, cache.kv, step, head_dim ** -0.5, window, ws)
    ref.attention_window(expected, q, cache.kv, step, head_dim ** -0.5, window, None)
    assert_close(out, expected)


ATTENTION_WITH_INPUTS_CASES = [  # q_lens, context_lens, heads, kv_heads, head_dim, page_size
    ([1], [1], 4, 4, 64, 16),                      # first token
    ([1], [77], 8, 1, 128, 16),                    # decode, GQA 8
    ([1, 1, 1], [5, 300, 129], 8, 2, 64, 16),      # batched decode
    ([1], [1100], 8, 2, 128, 16),                  # long context: the new key in the last split
    ([4, 1], [300, 70], 9, 3, 64, 16),             # a verify step beside a decode row
]


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "block"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qknorm"])
@pytest.mark.parametrize("case", ATTENTION_WITH_INPUTS_CASES, ids=_case_id)
def test_attention_with_inputs(ops, ref, device, kind, causal, qk_norm, case):
    """The optional fused op, where the backend implements it itself, against ref's
    attention_inputs followed by attention: the same output and the same cache."""
    if ops.attention_with_inputs is None:
        pytest.skip(f"backend {ops.name!r} does not implement the optional attention_with_inputs "
                    "(the model calls attention_inputs + attention, tested above)")
    q_lens, context_lens, heads, kv_heads, head_dim, page_size = case
    gen = torch.Generator().manual_seed(sum(context_lens) + 7)
    _, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, device, gen)
    expected = cache.clone()
    qkv, positions, slots = decode_step_inputs(q_lens, context_lens, table.cpu(), heads, kv_heads,
                                               head_dim, page_size, device, gen)
    qk = qk_transform(head_dim, 2048, device, qk_norm, gen)
    n, scale = qkv.shape[0], head_dim ** -0.5
    step = attention_step(cu, ctx, table, max(q_lens), table.shape[1] * page_size, positions,
                          slots)
    out = poisoned((n, heads, head_dim), torch.bfloat16, device)
    out_exp = poisoned((n, heads, head_dim), torch.bfloat16, device)
    ws = ops.attention_workspace(n, heads, head_dim, step.max_context_len, device)
    ops.attention_with_inputs(out, poisoned(out.shape, torch.bfloat16, device), cache.kv, qkv, qk,
                              step, scale, causal, ws)
    q_exp = poisoned(out.shape, torch.bfloat16, device)
    ref.attention_inputs(q_exp, expected.kv, qkv, qk, step)
    ref.attention(out_exp, q_exp, expected.kv, step, scale, causal, None)
    assert_cache_equal(cache, expected, slots, page_size)
    assert_close(out, out_exp)
