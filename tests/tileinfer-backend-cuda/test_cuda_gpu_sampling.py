"""CUDA sampling (sampling.cu) on the GPU: device sampling and acceptance give exactly the host's
tokens (``tileinfer.backend.sampling``) over many seeds, vocabulary sizes and filters, and the
ref backend's on the same GPU, filtered probabilities included."""

from __future__ import annotations

import pytest
import torch
from tileinfer.backend.sampling import SamplingParams, accept_host, accept_rows, sample_host, sample_rows
from tileinfer.testing.conformance import assert_close

from cuda_gpu import DEV

pytestmark = pytest.mark.gpu


def _llm_like_logits(n, vocab, gen, spread=4.0):
    """Logits with a heavy head like a language model's: a few large values over a broad tail."""
    base = torch.randn(n, vocab, generator=gen) * spread
    hot = torch.randint(0, vocab, (n, 8), generator=gen)
    base.scatter_(1, hot, base.gather(1, hot).abs() + 3 * spread)
    return base


# --- sampling ------------------------------------------------------------------------------------

SAMPLING = [
    SamplingParams(0.0),
    SamplingParams(1.0),
    SamplingParams(0.7, top_k=50),
    SamplingParams(0.9, top_p=0.9),
    SamplingParams(1.0, top_k=40, top_p=0.95),
    SamplingParams(1.5, top_p=0.5),
    SamplingParams(0.6, top_k=1),
    SamplingParams(2.0, top_p=0.99),          # a flat distribution: many top-p candidates
    SamplingParams(1.0, top_k=5000, top_p=0.8),  # more than the shared-memory candidate capacity
]


def _device_tokens(cuda, logits, params, seed, counter, with_probs=False):
    n = logits.shape[0]
    out = torch.full((n,), -1, dtype=torch.int32, device=DEV)
    probs = torch.full_like(logits, float("nan")) if with_probs else None
    cuda.sample_tokens(out, logits, params.temperature, params.top_k, params.top_p,
                       torch.tensor([seed], dtype=torch.int64, device=DEV),
                       torch.tensor([counter], dtype=torch.int64, device=DEV), probs)
    return out.cpu().long(), probs


@pytest.mark.parametrize("params", SAMPLING, ids=str)
@pytest.mark.parametrize("vocab", [32000, 128256])
def test_sampling_matches_host_over_many_seeds(cuda, params, vocab):
    """Token for token the host definition (sample_rows on the CPU, row j on stream counter + j)."""
    gen = torch.Generator().manual_seed(vocab + int(params.temperature * 100) + params.top_k)
    rows, seeds = 16, 8
    mismatches = []
    for seed in range(seeds):
        logits = _llm_like_logits(rows, vocab, gen)
        counter = 1000 * seed + 7
        dev, _ = _device_tokens(cuda, logits.to(DEV), params, seed * 7919 - 3, counter)
        host = sample_rows(logits, params, torch.tensor([seed * 7919 - 3]), torch.tensor([counter]))
        for j in torch.nonzero(dev != host).flatten().tolist():
            mismatches.append((seed, j, int(dev[j]), int(host[j])))
    assert not mismatches, f"{len(mismatches)}/{rows * seeds} rows differ (seed, row, device, host): {mismatches[:10]}"


def test_sample_host_itself_agrees(cuda):
    """The one-row host API, on a handful of rows, with large 64-bit seeds and counters."""
    gen = torch.Generator().manual_seed(5)
    logits = _llm_like_logits(6, 50000, gen)
    for params in SAMPLING:
        for seed, counter in ((0, 0), (2**40 + 17, 2**33 + 5), (-12345, 99)):
            dev, _ = _device_tokens(cuda, logits.to(DEV), params, seed, counter)
            for j in range(logits.shape[0]):
                assert int(dev[j]) == sample_host(logits[j], params, seed, counter + j), (params, seed, j)


@pytest.mark.parametrize("params", SAMPLING, ids=str)
def test_sampling_matches_ref_on_device_many_seeds(cuda, ref, params):
    """Against the ref backend on the same GPU (same float library): 200 seeds, probabilities too."""
    gen = torch.Generator().manual_seed(11)
    logits = _llm_like_logits(8, 32000, gen).to(DEV)
    for seed in range(200):
        dev, probs = _device_tokens(cuda, logits, params, seed, 3 * seed, with_probs=True)
        expected = torch.empty(8, dtype=torch.int32, device=DEV)
        probs_ref = torch.empty_like(logits)
        ref.sample_tokens(expected, logits, params.temperature, params.top_k, params.top_p,
                          torch.tensor([seed], device=DEV), torch.tensor([3 * seed], device=DEV), probs_ref)
        assert dev.tolist() == expected.cpu().long().tolist(), (params, seed)
        if seed < 3:
            assert_close(probs, probs_ref, torch.float16, what="filtered probabilities")


@pytest.mark.parametrize("params", SAMPLING[1:6], ids=str)
@pytest.mark.parametrize("with_q", [False, True], ids=["onehot-q", "draft-q"])
def test_accept_matches_host_over_many_seeds(cuda, params, with_q):
    gen = torch.Generator().manual_seed(3)
    n, vocab = 32, 32000
    mismatches = []
    for seed in range(10):
        logits = _llm_like_logits(n, vocab, gen)
        draft_logits = logits + torch.randn(n, vocab, generator=gen)
        q = torch.softmax(draft_logits, -1) if with_q else None
        drafts = torch.multinomial(torch.softmax(draft_logits, -1), 1, generator=gen)[:, 0].to(torch.int32)
        out = torch.full((n,), -1, dtype=torch.int32, device=DEV)
        cuda.accept_tokens(out, logits.to(DEV), drafts.to(DEV), None if q is None else q.to(DEV),
                           params.temperature, params.top_k, params.top_p,
                           torch.tensor([seed], device=DEV), torch.tensor([10 * seed], device=DEV))
        host = accept_rows(logits, drafts, q, params, torch.tensor([seed]), torch.tensor([10 * seed]))
        for j in torch.nonzero(out.cpu().long() != host).flatten().tolist():
            mismatches.append((seed, j, int(out[j]), int(host[j])))
    assert not mismatches, f"{len(mismatches)} rows differ (seed, row, device, host): {mismatches[:10]}"
    # and the one-row host API on a few rows
    j = 0
    assert int(out[j]) == accept_host(logits[j], int(drafts[j]), None if q is None else q[j], params, 9, 90 + j)
