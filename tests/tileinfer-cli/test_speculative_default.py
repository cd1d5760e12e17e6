"""`tileinfer run` and `tileinfer chat` decode plainly by default (a new process pays for the
first verify step of each size, which one answer does not win back: benchmarks/RESULTS.md);
--speculative ngram or --draft-k asks for n-gram drafts."""

import argparse

import pytest

from tileinfer import NgramProposer, SamplingParams
from tileinfer_cli.errors import UserError
from tileinfer_cli.options import add_speculative_options, speculative_from

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
