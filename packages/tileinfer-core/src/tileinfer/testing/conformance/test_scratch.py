"""Conformance: reserve_scratch, called twice (the second call finds what the first reserved),
and the ops that may keep scratch (split-K linear, split argmax sampling) still right after."""

from __future__ import annotations

import torch

from .helpers import SAMPLING, assert_close, make_weight, poisoned, rand, seed_counter


def _allocated(device):
    if device.type != "cuda":
        return None  # not measurable; the ops below still check the scratch works
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def test_reserve_scratch(ops, ref, device):
    assert ops.reserve_scratch(device) is None, "an op returns nothing"
    before = _allocated(device)
    assert ops.reserve_scratch(device) is None
    assert _allocated(device) == before, "a second reserve_scratch allocated more memory"

    # Decode-shaped products (one row, long K, narrow N: split-K where a backend splits), twice
    # each: the same bits (counters re-armed) and ref's values.
    x = rand((1, 1024), torch.bfloat16, device)
    for int8 in (False, True):
        w, scale = make_weight(48, 1024, device, int8)
        wg, scale_g = make_weight(2 * 48, 1024, device, int8)
        expected, expected_g = poisoned((1, 48), torch.bfloat16, device), poisoned((1, 48), torch.bfloat16, device)
        ref.linear(expected, x, w, scale, True)
        ref.linear_swiglu(expected_g, x, wg, scale_g, poisoned((1, 96), torch.bfloat16, device),
                         True)
        runs = []
        for _ in range(2):
            out, out_g = poisoned((1, 48), torch.bfloat16, device), poisoned((1, 48), torch.bfloat16, device)
            ops.linear(out, x, w, scale, True)
            ops.linear_swiglu(out_g, x, wg, scale_g, poisoned((1, 96), torch.bfloat16, device),
                              True)
            assert_close(out, expected, what="linear after reserve_scratch")
            assert_close(out_g, expected_g, what="linear_swiglu after reserve_scratch")
            runs.append((out, out_g))
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1]), \
            "a repeated launch gave different bits"

    # Greedy and plain temperature sampling (the split argmax where a backend splits), twice.
    logits = (torch.randn(4, 5000) * 3).to(device)
    seed, counter = seed_counter(device)
    for params in SAMPLING[:2]:
        expected = poisoned((4,), torch.int32, device)
        ref.sample_tokens(expected, logits, params.temperature, 0, 1.0, seed, counter, None)
        for _ in range(2):
            out = poisoned((4,), torch.int32, device)
            ops.sample_tokens(out, logits, params.temperature, 0, 1.0, seed, counter, None)
            assert out.cpu().tolist() == expected.cpu().tolist(), str(params)
