"""Conformance: batch-invariant ops, for a backend whose ``BackendInfo`` declares
``batch_invariant`` (others skip these tests and still pass the rest).

linear ops with ``Invariance.BATCH``: a row's result is the same bits in steps of 1..256 rows
(odd sizes too; 1..64 on the CPU), at any place among the others. attention with ``AttentionStep.batch_invariant``:
a query row's result is the same bits whether it comes alone as a decode step, in a prefill of
many rows, in prefill chunks, beside other sequences of other lengths, or over the same keys in
other pages. docs/determinism.md has what this guarantees."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tileinfer.backend.hookspecs import Invariance

from .helpers import (CACHE_KINDS, WEIGHT_KINDS, XIELU, Cache, assert_close, attention_step,
                      make_weight_of, poisoned, rand, write_pages)

STEP_ROWS = (1, 2, 7, 16, 17, 100, 255, 256)
PROBES = (0, 5, 17, 100, 255)  # rows of x checked in every step


def _steps(device):
    """(rows of x, the step sizes, the probes). Fewer on the CPU, where Triton's interpreter runs
    each program in Python: steps of up to 64 rows, two 16-row tiles and more among them."""
    if device.type == "cpu":
        return 64, (1, 2, 7, 16, 17, 37, 64), (0, 5, 17, 40, 63)
    return 256, STEP_ROWS, PROBES


@pytest.fixture
def invariant_ops(ops):
    if not ops.backend.info.batch_invariant:
        pytest.skip(f"backend {ops.name!r} does not declare batch-invariant ops")
    return ops


def _linear_run(ops, op, w, scale, out_f, device):
    dtype = torch.float32 if op == "linear_logits" else torch.bfloat16

    def run(rows):
        n = rows.shape[0]
        out = poisoned((n, out_f), dtype, device)
        if op == "linear_swiglu":
            ops.linear_swiglu(out, rows, w, scale, poisoned((n, 2 * out_f), torch.bfloat16, device),
                              Invariance.BATCH)
        elif op == "linear_xielu":
            ops.linear_xielu(out, rows, w, scale, XIELU, Invariance.BATCH)
        else:
            ops.linear(out, rows, w, scale, Invariance.BATCH)
        return out

    return run


@pytest.mark.parametrize("in_f", [576, 256])
@pytest.mark.parametrize("weights", WEIGHT_KINDS)
@pytest.mark.parametrize("op", ["linear", "linear_logits", "linear_swiglu", "linear_xielu"])
def test_linear_rows_are_the_same_in_steps_of_any_size(invariant_ops, ref, device, weights, op,
                                                       in_f):
    out_f = 160
    total, steps, probes = _steps(torch.device(device))
    gen = torch.Generator().manual_seed(in_f + WEIGHT_KINDS.index(weights))
    x = rand((total, in_f), torch.bfloat16, device, 1.0, gen)
    w, scale = make_weight_of(weights, 2 * out_f if op == "linear_swiglu" else out_f, in_f, device,
                              invariant_ops)
    run = _linear_run(invariant_ops, op, w, scale, out_f, device)
    alone = {i: run(x[i:i + 1].clone()) for i in probes}
    for n in steps:
        index = (torch.arange(n) * 37 + n) % total
        index[n // 2] = probes[n % len(probes)]  # a probe at a place that moves with n
        out = run(x[index.to(x.device)].clone())
        for place, row in enumerate(index.tolist()):
            if row in alone:
                assert torch.equal(out[place:place + 1], alone[row]), \
                    f"{op}: row {row} at place {place} of a {n}-row step differs from it alone"
    # and the values are the op's (against ref, as the other linear tests)
    expected = _linear_run(ref, op, w, scale, out_f, device)(x)
    together = run(x.clone())
    if op == "linear_logits":
        assert_close(together, expected, dtype=torch.bfloat16)
    else:
        assert_close(together, expected)


HEADS, KV_HEADS, HEAD_DIM, PAGE = 9, 3, 64, 16  # SmolLM2-135M's attention


def _sizes(device):
    """(context lengths of the sequences in the cache: the probe, a copy of it in other pages,
    a long one with more splits, a short one; the probe's last rows that every arrangement
    computes). Smaller on the CPU, where Triton's interpreter runs each program in Python: the
    probe's rows still straddle a 256-position split boundary there."""
    if device.type == "cpu":
        return {"probe": 260, "copy": 260, "long": 530, "short": 20}, 8
    return {"probe": 700, "copy": 700, "long": 1100, "short": 20}, 24


def _attention_setup(kind, device, lengths):
    gen = torch.Generator().manual_seed(31)
    pages = {name: math.ceil(n / PAGE) for name, n in lengths.items()}
    num_pages = sum(pages.values()) + 1
    order = torch.randperm(num_pages, generator=gen).to(torch.int32)
    cache, tables, used = Cache(num_pages, PAGE, KV_HEADS, HEAD_DIM, kind, "cpu"), {}, 0
    kv = {}
    for name, n in lengths.items():
        tables[name] = order[used:used + pages[name]]
        used += pages[name]
        source = "probe" if name == "copy" else name
        if source not in kv:
            kv[source] = (rand((n, KV_HEADS, HEAD_DIM), torch.bfloat16, "cpu", 1.0, gen),
                          rand((n, KV_HEADS, HEAD_DIM), torch.bfloat16, "cpu", 1.0, gen))
        pos = torch.arange(n)
        write_pages(cache, *kv[source], tables[name][pos // PAGE].long() * PAGE + pos % PAGE)
    for attr in ("k", "v", "k_scale", "v_scale", "k_smooth"):
        t = getattr(cache, attr)
        if t is not None:
            setattr(cache, attr, t.to(device))
    queries = {name: rand((n, HEADS, HEAD_DIM), torch.bfloat16, device, 1.0, gen)
               for name, n in lengths.items()}
    queries["copy"] = queries["probe"]
    return cache, tables, queries


def _attend(ops, cache, tables, entries, device):
    """One batch-invariant step of entries (sequence name, query rows q (q_len, heads, dim),
    context length): the output rows of each entry."""
    q = torch.cat([rows for _, rows, _ in entries])
    cu = torch.tensor([0] + [rows.shape[0] for _, rows, _ in entries], dtype=torch.int32).cumsum(0)
    ctx = torch.tensor([c for _, _, c in entries], dtype=torch.int32)
    width = max(tables[name].numel() for name, _, _ in entries) + 1
    table = torch.full((len(entries), width), 0, dtype=torch.int32)
    for b, (name, _, _) in enumerate(entries):
        table[b, :tables[name].numel()] = tables[name]
    step = attention_step(cu.to(torch.int32).to(device), ctx.to(device), table.to(device),
                          max(rows.shape[0] for _, rows, _ in entries), int(ctx.max()))
    step = dataclasses.replace(step, batch_invariant=True)
    out = poisoned(q.shape, q.dtype, device)
    ws = ops.attention_workspace(q.shape[0], HEADS, HEAD_DIM, step.max_context_len, device)
    ops.attention(out, q, cache.kv, step, HEAD_DIM ** -0.5, True, ws)
    return list(torch.split(out, [rows.shape[0] for _, rows, _ in entries]))


@pytest.mark.parametrize("kind", CACHE_KINDS)
def test_attention_rows_are_the_same_however_they_come(invariant_ops, ref, device, kind):
    lengths, rows = _sizes(torch.device(device))
    cache, tables, q = _attention_setup(kind, device, lengths)
    n = lengths["probe"]
    first = n - rows
    alone = torch.cat([_attend(invariant_ops, cache, tables, [("probe", q["probe"][p:p + 1], p + 1)],
                               device)[0] for p in range(first, n)])
    prefill = _attend(invariant_ops, cache, tables, [("probe", q["probe"][first:], n)], device)[0]
    cut = first + rows // 2 - 1
    chunks = torch.cat([
        _attend(invariant_ops, cache, tables, [("probe", q["probe"][first:cut], cut)], device)[0],
        _attend(invariant_ops, cache, tables, [("probe", q["probe"][cut:], n)], device)[0]])
    beside = _attend(invariant_ops, cache, tables, [
        ("short", q["short"][-3:], lengths["short"]), ("probe", q["probe"][first:], n),
        ("long", q["long"][-rows - 5:], lengths["long"])], device)[1]
    other_pages = _attend(invariant_ops, cache, tables, [("copy", q["copy"][first:], n)], device)[0]
    decode_among_prefill = _attend(invariant_ops, cache, tables, [
        ("long", q["long"][-rows:], lengths["long"]), ("probe", q["probe"][n - 1:], n)], device)[1]
    for name, got in (("one prefill", prefill), ("two chunks", chunks),
                      ("beside other sequences", beside), ("other pages", other_pages)):
        assert torch.equal(got, alone), f"{kind}: the rows of {name} differ from decode steps"
    assert torch.equal(decode_among_prefill, alone[-1:]), \
        f"{kind}: a decode row beside a prefill differs from it alone"
    step = attention_step(torch.tensor([0, rows], dtype=torch.int32, device=device),
                          torch.tensor([n], dtype=torch.int32, device=device),
                          tables["probe"][None].to(device), rows, n)
    expected = poisoned(prefill.shape, prefill.dtype, device)
    ref.attention(expected, q["probe"][first:], cache.kv, step, HEAD_DIM ** -0.5, True, None)
    assert_close(prefill, expected)
