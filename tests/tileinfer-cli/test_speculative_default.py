"""`tileinfer run` and `tileinfer chat` decode plainly by default (capturing the verify steps
lengthens a new process's start: benchmarks/RESULTS.md); --speculative ngram or --draft-k asks
for n-gram drafts, and the warm-up on a GPU then gets the proposer."""

import argparse

import pytest

from tileinfer import NgramProposer, SamplingParams
from tileinfer_cli.errors import UserError
from tileinfer_cli.options import add_speculative_options, speculative_from, warm_up_on_gpu

GREEDY, SAMPLED = SamplingParams(0.0), SamplingParams(0.8, top_p=0.9)


def options(*argv):
    p = argparse.ArgumentParser()
    add_speculative_options(p)
    return p.parse_args(list(argv))


@pytest.mark.parametrize("argv,sampling,k", [
    (("--draft-k", "3"), SAMPLED, 3),                 # asking for drafts while sampling
    (("--draft-k", "4"), GREEDY, 4),
    (("--speculative", "ngram"), SAMPLED, 7),
    (("--speculative", "ngram", "--draft-k", "5"), GREEDY, 5),
])
def test_ngram_proposer_where_greedy_or_asked(argv, sampling, k):
    proposer = speculative_from(options(*argv), model=None, sampling=sampling)
    assert isinstance(proposer, NgramProposer) and proposer.k == k


@pytest.mark.parametrize("argv,sampling", [((), SAMPLED), ((), GREEDY),
                                           (("--speculative", "none"), GREEDY)])
def test_plain_decoding_when_sampling_or_turned_off(argv, sampling):
    assert speculative_from(options(*argv), model=None, sampling=sampling) is None


def test_draft_k_with_speculation_off_is_a_mistake():
    with pytest.raises(UserError, match="--draft-k needs speculative decoding"):
        speculative_from(options("--speculative", "none", "--draft-k", "3"), None, GREEDY)


def test_a_command_without_the_options_does_not_speculate():
    assert speculative_from(argparse.Namespace(), None, GREEDY) is None


def test_the_warm_up_on_a_gpu_gets_the_proposer(monkeypatch):
    import tileinfer

    calls = []
    monkeypatch.setattr(tileinfer, "warm_up", lambda model, sampling, **kw: calls.append(kw))
    proposer = NgramProposer(k=3)
    on_gpu = argparse.Namespace(device=argparse.Namespace(type="cuda"))
    warm_up_on_gpu(on_gpu, GREEDY, None, None, proposer)
    assert calls == [dict(kv_quantize=None, key_smoothing=None, speculative=proposer)]
    warm_up_on_gpu(argparse.Namespace(device=argparse.Namespace(type="cpu")), GREEDY, None, None,
                   proposer)
    assert len(calls) == 1  # nothing to load or capture on the CPU
