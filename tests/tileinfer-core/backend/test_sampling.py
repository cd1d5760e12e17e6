"""The sampler: parameter validation, filters against a sort-based reading, and distributions
checked statistically (host sampler; the device samplers are checked token for token against it
by the conformance suite)."""

import math

import pytest
import torch

from tileinfer.backend.sampling import (SamplingParams, accept_rows, bits_to_uniform,
                                        filtered_probs, sample_host, sample_rows, uniform)

N = 40_000  # samples per distribution test: the standard error of a frequency is <= 0.0025


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=math.nan), "temperature"),
    (dict(temperature=math.inf), "temperature"), (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_p=math.nan), "top_p"),
])
def test_bad_sampling_values_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def sorted_filter_reference(logits, params):
    """Top-k then top-p by sorting, written independently of the bisection in sampling.py."""
    s = logits.double() / params.temperature
    order = torch.argsort(s, descending=True, stable=True)
    keep = torch.zeros_like(s, dtype=torch.bool)
    k = params.top_k or len(s)
    kth = s[order[min(k, len(s)) - 1]]
    keep[s >= kth] = True  # ties with the k-th value are kept
    if params.top_p < 1:
        p = torch.softmax(torch.where(keep, s, -math.inf), -1)
        mass = 0.0
        nucleus = torch.zeros_like(keep)
        for i in order.tolist():
            if not keep[i]:
                continue
            nucleus[i] = True
            mass += float(p[i])
            if mass >= params.top_p:
                break
        threshold = s[nucleus].min()
        keep &= s >= threshold
    return torch.softmax(torch.where(keep, s, -math.inf), -1)


@pytest.mark.parametrize("params", [
    SamplingParams(1.0), SamplingParams(0.5, top_k=3), SamplingParams(1.5, top_p=0.7),
    SamplingParams(1.0, top_k=5, top_p=0.5), SamplingParams(2.0, top_k=1),
], ids=str)
def test_filters_match_a_sort_based_reference(params):
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        logits = torch.randn(1, 50, generator=gen) * 2
        expected = sorted_filter_reference(logits[0], params).float()
        assert torch.allclose(filtered_probs(logits, params)[0], expected, atol=1e-6)


def test_greedy_is_argmax_with_lowest_index_on_ties():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0]])
    assert sample_host(logits, SamplingParams(0.0), seed=1, counter=0) == 1


def test_token_is_a_function_of_seed_and_counter():
    logits = torch.randn(1, 1000)
    params = SamplingParams(1.0)
    a = [sample_host(logits, params, 42, c) for c in range(50)]
    assert a == [sample_host(logits, params, 42, c) for c in range(50)]
    assert a != [sample_host(logits, params, 43, c) for c in range(50)]
    assert len(set(a)) > 10  # different counters draw different tokens


def test_extreme_bits_give_finite_gumbel_noise():
    # With 24 bits, (2**24 - 1) + 0.5 rounds to 2**24 in float32: u = 1, noise +inf, and a
    # filtered-out token (score -inf) would win through -inf + inf = NaN.
    u = bits_to_uniform(torch.tensor([0, (1 << 23) - 1]))
    assert 0 < float(u[0]) and float(u[1]) < 1
    assert torch.isfinite(-torch.log(-torch.log(u))).all()


def test_uniform_is_uniform():
    u = uniform(7, torch.arange(N), 3)
    assert 0 < float(u.min()) and float(u.max()) < 1
    hist = torch.histc(u, bins=10, min=0, max=1) / N
    assert (hist - 0.1).abs().max() < 0.01


def empirical(ids, vocab):
    return torch.bincount(ids, minlength=vocab).double() / len(ids)


@pytest.mark.parametrize("params", [
    SamplingParams(1.0), SamplingParams(0.7), SamplingParams(1.3, top_k=4),
    SamplingParams(1.0, top_p=0.8), SamplingParams(0.9, top_k=6, top_p=0.9),
], ids=str)
def test_samples_follow_the_filtered_distribution(params):
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.7, 0.3, 0.0, -0.5, -1.0, -2.0, -3.0]])
    rows = logits.expand(N, -1)
    ids = sample_rows(rows, params, torch.tensor([11]), torch.tensor([0]))
    freq, p = empirical(ids, 10), filtered_probs(logits, params)[0].double()
    assert (freq - p).abs().max() < 0.012  # ~5 standard errors
    assert freq[p == 0].sum() == 0  # nothing outside the kept set


@pytest.mark.parametrize("with_q", [True, False], ids=["draft-distribution", "deterministic-draft"])
def test_pq_rule_preserves_the_target_distribution(with_q):
    vocab = 8
    gen = torch.Generator().manual_seed(3)
    target = torch.randn(1, vocab, generator=gen) * 1.5
    draft = torch.randn(1, vocab, generator=gen) * 1.5
    params = SamplingParams(1.0)
    p = filtered_probs(target, params)[0].double()
    q = torch.softmax(draft, -1)
    if with_q:
        drafts = torch.multinomial(q[0], N, replacement=True, generator=gen)
        draft_probs = q.expand(N, -1)
    else:
        drafts = torch.full((N,), int(torch.argmax(draft)))  # always the same draft token
        draft_probs = None
    out = accept_rows(target.expand(N, -1), drafts, draft_probs, params, torch.tensor([5]),
                      torch.tensor([0]))
    rejected = (out != drafts).double().mean()
    assert rejected > 0.05  # the resample branch is exercised
    assert (empirical(out, vocab) - p).abs().max() < 0.012
