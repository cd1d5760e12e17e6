"""Speculative sampling keeps the target's distribution: the backends' ``accept_tokens`` op over
many rows (drafts from a distribution q, deterministic drafts, drafts outside the kept set of a
filtered p; the resample branch), and the whole speculative loop (the synchronous one, and the
pipelined one of host proposers) on a tiny model of a 5-token vocabulary, whose three-token
outputs over many seeds are compared with the exact distribution by a chi-square test."""

from __future__ import annotations

import itertools

import pytest
import torch

from speculative_helpers import one_cpu_thread  # noqa: F401
from tileinfer import ModelRunner, SamplingParams, SpecStats, forward, get_backend
from tileinfer.backend.sampling import filtered_probs
from tileinfer.engine.kv.cache import new_cache
from tileinfer.engine.generation.generate import generate_into
from tileinfer.engine.generation.speculative.proposer import Draft, Proposer
from tileinfer.model.config import config_from_dict
from tileinfer.model.random_weights import random_model


def chi_square_p_value(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test of counts against expected counts; cells expected below 5 are pooled."""
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum().reshape(1)]).double()
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)]).double()
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = torch.tensor(float(len(obs) - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))


def op_backends():
    from tileinfer.backend.registry import list_backends

    params = [pytest.param("ref", "cpu")]
    for b in list_backends():
        if b.available and "cuda" in b.info.devices:
            params.append(pytest.param(b.name, "cuda", marks=pytest.mark.gpu, id=f"{b.name}-cuda"))
    return params


# --- the op ------------------------------------------------------------------------------------

N = 40_000
VOCAB = 8


@pytest.mark.parametrize("backend,device", op_backends())
@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.8, top_k=5),
                                    SamplingParams(1.2, top_p=0.7)], ids=str)
@pytest.mark.parametrize("drafts", ["sampled", "deterministic"])
def test_accept_tokens_keeps_the_target_distribution(backend, device, params, drafts):
    ops = get_backend(backend)
    gen = torch.Generator().manual_seed(7)
    target = torch.randn(1, VOCAB, generator=gen) * 1.5
    p = filtered_probs(target, params)[0].double()
    # q puts mass everywhere, also on tokens the filters drop from p (always rejected).
    q = torch.softmax(torch.randn(1, VOCAB, generator=gen), -1)
    if drafts == "sampled":
        draft_ids = torch.multinomial(q[0], N, replacement=True, generator=gen)
        draft_probs = q.expand(N, -1).contiguous().to(device)
    else:
        draft_ids = torch.full((N,), int(q.argmin()))  # a draft p rarely (or never) keeps
        draft_probs = None
    out = torch.empty(N, dtype=torch.int32, device=device)
    seed = torch.tensor([12345], dtype=torch.int64, device=device)
    counter = torch.tensor([3], dtype=torch.int64, device=device)
    ops.accept_tokens(out, target.expand(N, -1).contiguous().to(device),
                      draft_ids.to(torch.int32).to(device), draft_probs, params.temperature,
                      params.top_k, params.top_p, seed, counter)
    out = out.long().cpu()
    rejected = out != draft_ids
    assert rejected.double().mean() > 0.05  # the resample branch is exercised
    assert (p[draft_ids[~rejected]] > 0).all()  # nothing outside p's kept set is accepted
    counts = torch.bincount(out, minlength=VOCAB).double()
    assert counts[p == 0].sum() == 0
    assert chi_square_p_value(counts, N * p) > 1e-4


# --- the whole speculative loop ----------------------------------------------------------------

TINY = dict(model_type="llama", vocab_size=5, hidden_size=32, intermediate_size=64,
            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=64, rms_norm_eps=1e-5)
PROMPT = [1, 2, 3, 4]
NEW = 3  # token 0 from the prefill, then a verify step of 2 drafts (and more when rejected)
TRIALS = 1500


@pytest.fixture(scope="module")
def tiny_vocab_model():
    model = random_model(config_from_dict(TINY), dtype=torch.float32, backend="ref",
                         device="cpu", max_len=32, seed=1)
    model.weights.lm_head.mul_(10)  # logits of std ~1: distributions far from uniform
    return model


def exact_distribution(model, params) -> torch.Tensor:
    """P(t0, t1, t2) after PROMPT: the product of the filtered next-token distributions."""
    v = model.config.vocab_size
    joint = torch.zeros(v, v, v, dtype=torch.float64)
    for a, b in itertools.product(range(v), repeat=2):
        cache = new_cache(model, 16)
        logits = forward(model, cache, cache.new_sequence(), PROMPT + [a, b], all_logits=True)
        p = filtered_probs(logits[-3:], params).double()  # rows: t0, t1 | a, t2 | a, b
        joint[a, b] = p[0, a] * p[1, b] * p[2]
    return joint.flatten()


class SampledDrafts(Proposer):
    """Drafts drawn from a fixed q with a generator of its own (independent of the target's
    streams), returned with q."""

    def __init__(self, q, k=2, seed=0):
        self.q, self.k = q, k
        self.gen = torch.Generator().manual_seed(seed)

    def propose(self, tokens, k):
        ids = torch.multinomial(self.q, k, replacement=True, generator=self.gen)
        return Draft(ids.tolist(), self.q.expand(k, -1).contiguous())


class ConstantDrafts(Proposer):
    def __init__(self, ids):
        self.ids, self.k = list(ids), len(ids)

    def propose(self, tokens, k):
        return self.ids[:k]


class PipelinedConstantDrafts(Proposer):
    """A host proposer (it has ``continuation``, so the pipelined loop runs it) that always
    guesses the same token, drafting at every step and chaining each step on all drafts of the
    one before: every kind of failed guess happens."""

    adaptive = False

    def __init__(self, token, k=2):
        self.token, self.k = token, k

    def prediction(self, tokens):
        return self.token

    def continuation(self, tokens, tail, n):
        return [self.token] * n


@pytest.mark.slow
@pytest.mark.parametrize("params,proposer", [
    (SamplingParams(0.9, top_k=3), lambda: SampledDrafts(torch.tensor([.1, .1, .2, .3, .3]))),
    (SamplingParams(1.0), lambda: ConstantDrafts([0, 0])),
    (SamplingParams(0.9, top_p=0.9), lambda: PipelinedConstantDrafts(3)),
], ids=["sampled-drafts-top-k", "constant-drafts", "pipelined-constant-drafts"])
def test_speculative_generation_follows_the_target_distribution(tiny_vocab_model, params,
                                                                proposer):
    model = tiny_vocab_model
    cache = new_cache(model, 16)
    runner = ModelRunner(model, cache)
    seq = cache.new_sequence()
    runner.forward(seq, PROMPT[:-1])  # shared by every trial
    proposer = proposer()
    v = model.config.vocab_size
    counts = torch.zeros(v ** NEW, dtype=torch.float64)
    rejected = drafted = 0
    free = cache.free_pages
    for trial in range(TRIALS):
        stats = SpecStats()
        out = generate_into(runner, seq, PROMPT[-1:], NEW, params, stop_ids=[], seed=trial,
                            speculative=proposer, spec_stats=stats)
        assert seq.tokens == PROMPT + out[:-1]
        cache.truncate(seq, len(PROMPT) - 1)
        assert cache.free_pages == free
        counts[(out[0] * v + out[1]) * v + out[2]] += 1
        drafted += stats.drafted
        rejected += stats.drafted - stats.accepted
    assert rejected > 0.2 * drafted  # the resample branch is exercised often
    assert drafted - rejected > 0.05 * drafted  # and acceptance too
    expected = TRIALS * exact_distribution(model, params)
    assert counts[expected == 0].sum() == 0
    assert chi_square_p_value(counts, expected) > 1e-4
