"""The seeds of a request's choices: a prompt's first choice takes the request's seed, its others
the seed mixed with their index, so that requests with consecutive seeds never share samples."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("pydantic")

from tileinfer_cli.serve.defaults import SamplingDefaults
from tileinfer_cli.serve.prepare import choice_seed, plan_completion
from tileinfer_cli.serve.schemas import CompletionRequest


def test_the_first_choice_keeps_the_seed_and_the_others_are_64_bit_mixes():
    for seed in (0, 1, 7, -5, 2**63 - 1, -2**63):
        assert choice_seed(seed, 0) == seed
        for j in range(1, 17):
            assert -2**63 <= choice_seed(seed, j) < 2**63
    # SplitMix64's published first two outputs from state 0.
    assert choice_seed(0, 1) % 2**64 == 0xE220A8397B1DCDAF
    assert choice_seed(0, 2) % 2**64 == 0x6E789E6AA1B965F4


def test_consecutive_seeds_share_no_choice_seed():
    # With seed + j, seeds 0..99 at n = 16 would give 115 streams for 1,600 choices.
    seeds = {choice_seed(s, j) for s in range(100) for j in range(16)}
    assert len(seeds) == 100 * 16


def test_each_prompt_of_a_request_takes_the_same_choice_seeds(tmp_path):
    served = SimpleNamespace(defaults=SamplingDefaults.of_folder(tmp_path), vocab_size=1000, max_len=256,
                             stop_ids=[2], tokenizer=None, tool_parser=None)
    req = CompletionRequest(model="m", prompt=[[1, 2], [3, 4, 5]], n=3, seed=11, max_tokens=4)
    plan = plan_completion(served, req)
    expected = [11, choice_seed(11, 1), choice_seed(11, 2)]
    assert [plan.seed_of(i) for i in range(plan.choices)] == expected * 2
    unseeded = plan_completion(served, CompletionRequest(model="m", prompt=[1], n=2, max_tokens=4))
    assert [unseeded.seed_of(i) for i in range(2)] == [None, None]
