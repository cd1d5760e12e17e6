"""Conformance: sample_tokens and accept_tokens, token for token as the ref backend."""

from __future__ import annotations

import pytest
import torch

from .helpers import SAMPLING, assert_close, poisoned, seed_counter


@pytest.mark.parametrize("params", SAMPLING, ids=str)
@pytest.mark.parametrize("n,vocab", [(1, 1000), (5, 3001), (2, 50000)])
def test_sample_tokens(ops, ref, device, params, n, vocab):
    logits = (torch.randn(n, vocab) * 3).to(device)
    logits[0, 7] = logits[0, 8] = logits[0].max() + 1  # a tie: the lower index wins when greedy
    seed, counter = seed_counter(device)
    t, k, p = params.temperature, params.top_k, params.top_p
    out, expected = poisoned((n,), torch.int32, device), poisoned((n,), torch.int32, device)
    probs = poisoned((n, vocab), torch.float32, device)
    probs_exp = poisoned((n, vocab), torch.float32, device)
    ops.sample_tokens(out, logits, t, k, p, seed, counter, probs)
    ref.sample_tokens(expected, logits, t, k, p, seed, counter, probs_exp)
    assert out.cpu().tolist() == expected.cpu().tolist()
    assert_close(probs, probs_exp, torch.float16, what="filtered probabilities")
    # Without probs_out the same tokens come out.
    again = poisoned((n,), torch.int32, device)
    ops.sample_tokens(again, logits, t, k, p, seed, counter, None)
    assert again.cpu().tolist() == expected.cpu().tolist()


@pytest.mark.parametrize("params", SAMPLING[1:], ids=str)
@pytest.mark.parametrize("with_q", [False, True], ids=["onehot-q", "draft-q"])
def test_accept_tokens(ops, ref, device, params, with_q):
    n, vocab = 64, 500
    gen = torch.Generator().manual_seed(7)
    logits = (torch.randn(n, vocab, generator=gen) * 2).to(device)
    draft_logits = logits.cpu() + torch.randn(n, vocab, generator=gen)
    q = torch.softmax(draft_logits, -1).to(device) if with_q else None
    drafts = torch.multinomial(torch.softmax(draft_logits, -1), 1, generator=gen)[:, 0]
    drafts = drafts.to(torch.int32).to(device)
    seed, counter = seed_counter(device, 99, 0)
    t, k, p = params.temperature, params.top_k, params.top_p
    out, expected = poisoned((n,), torch.int32, device), poisoned((n,), torch.int32, device)
    ops.accept_tokens(out, logits, drafts, q, t, k, p, seed, counter)
    ref.accept_tokens(expected, logits, drafts, q, t, k, p, seed, counter)
    assert out.cpu().tolist() == expected.cpu().tolist()
