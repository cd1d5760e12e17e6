"""Conformance: sample_tokens, accept_tokens and the optional sample_per_row and
sample_tokens_with_sums, token for token as the ref backend and the host definition."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backend.sampling import SamplingParams

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


# The rows of a batched step: separate requests, each with its own parameters and stream.
PER_ROW = [SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7, top_k=20),
           SamplingParams(1.3, top_p=0.9), SamplingParams(0.8, top_k=50, top_p=0.8),
           SamplingParams(1.0, top_k=1), SamplingParams(0.0), SamplingParams(0.6, top_k=3000)]


@pytest.mark.parametrize("vocab", [1000, 3001])
def test_sample_per_row(ops, device, vocab):
    """Optional op: each row is the token a one-row sample_tokens call with its parameters and
    stream gives, and what the host definition gives."""
    if ops.sample_per_row is None:
        pytest.skip("sample_per_row is optional and this backend does not implement it")
    from tileinfer.backend.sampling import row_parameters, sample_host

    params = PER_ROW + PER_ROW[1:4]
    n = len(params)
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(n, vocab, generator=gen) * 3
    logits[0, 7] = logits[0, 8] = logits[0].max() + 1  # a greedy tie: the lower index wins
    seeds = [1234 + 7 * j if j % 3 else 99 for j in range(n)]  # some rows share a seed
    counters = [5 + j % 4 for j in range(n)]  # and some a counter
    inv_t, top_k, top_p = row_parameters(params)
    args = (torch.tensor(inv_t, dtype=torch.float32), torch.tensor(top_k, dtype=torch.int32),
            torch.tensor(top_p, dtype=torch.float32), torch.tensor(seeds, dtype=torch.int64),
            torch.tensor(counters, dtype=torch.int64))
    out = poisoned((n,), torch.int32, device)
    ops.sample_per_row(out, logits.to(device), *(a.to(device) for a in args))
    expected = [sample_host(logits[j], params[j], seeds[j], counters[j]) for j in range(n)]
    assert out.cpu().tolist() == expected
    for j in (1, 4, 9):  # a one-row sample_tokens call gives the row's token too
        one = poisoned((1,), torch.int32, device)
        p = params[j]
        ops.sample_tokens(one, logits[j:j + 1].to(device), p.temperature, p.top_k, p.top_p,
                          *seed_counter(device, seeds[j], counters[j]), None)
        assert one.cpu().tolist() == [expected[j]]


@pytest.mark.parametrize("params", SAMPLING, ids=str)
@pytest.mark.parametrize("n,vocab", [(1, 1000), (3, 50000), (2, 128256)])
def test_sample_tokens_with_sums(ops, ref, device, params, n, vocab):
    """Optional op: the tokens of sample_tokens, and each row's sum (any order of addition); a
    row with NaN or infinity sums to a non-finite value."""
    if ops.sample_tokens_with_sums is None:
        pytest.skip("sample_tokens_with_sums is optional and this backend does not implement it")
    if vocab > 50000 and torch.device(device).type == "cpu":
        pytest.skip("llama3's vocabulary runs on GPUs; on the CPU (Triton's interpreter runs "
                    "each program in Python) 50000 entries span as many chunks")
    gen = torch.Generator().manual_seed(n * vocab)
    logits = torch.randn(n, vocab, generator=gen) * 3
    logits[0, 7] = logits[0, 8] = logits[0].max() + 1  # a greedy tie: the lower index wins
    seed, counter = seed_counter(device)
    t, k, p = params.temperature, params.top_k, params.top_p
    out, expected = poisoned((n,), torch.int32, device), poisoned((n,), torch.int32, device)
    sums = poisoned((n,), torch.float32, device)
    ops.sample_tokens_with_sums(out, sums, logits.to(device), t, k, p, seed, counter)
    ref.sample_tokens(expected, logits.to(device), t, k, p, seed, counter, None)
    assert out.cpu().tolist() == expected.cpu().tolist()
    exact = logits.double().sum(dim=1)
    bound = 1e-5 * logits.double().abs().sum(dim=1)  # float32 sums in any order
    assert ((sums.cpu().double() - exact).abs() <= bound).all(), (sums.cpu(), exact)
    for bad in (float("nan"), float("inf"), float("-inf")):
        broken = logits.clone()
        broken[n - 1, vocab // 2] = bad
        ops.sample_tokens_with_sums(out, sums, broken.to(device), t, k, p, seed, counter)
        finite = torch.isfinite(sums.cpu()).tolist()
        assert finite == [True] * (n - 1) + [False], (bad, finite)


# Logit processing (tileinfer.backend.logit_processing) runs before the sampling ops: min_p
# leaves -inf logits, a logit bias large finite ones; the ops must sample such rows as ref does.
PROCESSED = [SamplingParams(0.0, logit_bias={3: 100.0}), SamplingParams(0.8, min_p=0.2),
             SamplingParams(1.0, top_k=20, min_p=0.1),
             SamplingParams(0.7, top_p=0.9, min_p=0.05, logit_bias={5: -100.0})]


@pytest.mark.parametrize("params", PROCESSED, ids=str)
def test_sample_tokens_after_logit_processing(ops, ref, device, params):
    from tileinfer.backend.logit_processing import process_host

    n, vocab = 3, 3001
    gen = torch.Generator().manual_seed(11)
    raw = torch.randn(n, vocab, generator=gen) * 3
    logits = torch.cat([process_host(raw[j], params) for j in range(n)]).to(device)
    seed, counter = seed_counter(device)
    t, k, p = params.temperature, params.top_k, params.top_p
    out, expected = poisoned((n,), torch.int32, device), poisoned((n,), torch.int32, device)
    ops.sample_tokens(out, logits, t, k, p, seed, counter, None)
    ref.sample_tokens(expected, logits, t, k, p, seed, counter, None)
    assert out.cpu().tolist() == expected.cpu().tolist()
    if ops.sample_per_row is not None:
        from tileinfer.backend.sampling import row_parameters

        inv_t, top_k, top_p = row_parameters([params] * n)
        rows = poisoned((n,), torch.int32, device)
        ops.sample_per_row(rows, logits, torch.tensor(inv_t, dtype=torch.float32).to(device),
                           torch.tensor(top_k, dtype=torch.int32).to(device),
                           torch.tensor(top_p, dtype=torch.float32).to(device),
                           torch.full((n,), 1234, dtype=torch.int64).to(device),
                           torch.arange(n, dtype=torch.int64).to(device))
        ref_rows = poisoned((n,), torch.int32, device)
        ref.sample_per_row(ref_rows, logits, torch.tensor(inv_t, dtype=torch.float32).to(device),
                           torch.tensor(top_k, dtype=torch.int32).to(device),
                           torch.tensor(top_p, dtype=torch.float32).to(device),
                           torch.full((n,), 1234, dtype=torch.int64).to(device),
                           torch.arange(n, dtype=torch.int64).to(device))
        assert rows.cpu().tolist() == ref_rows.cpu().tolist()
