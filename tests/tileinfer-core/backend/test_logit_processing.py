"""Logit bias, penalties and min_p on the host (``tileinfer.backend.logit_processing``, which
``sample_host`` applies): validation, each step against an independent reference (transformers'
RepetitionPenaltyLogitsProcessor and MinPLogitsWarper, the OpenAI formula written out token by
token), vLLM's order, and neutral values leaving the logits bit for bit."""

import math

import pytest
import torch

from tileinfer.backend.logit_processing import process_host
from tileinfer.backend.sampling import SamplingParams, sample_host

VOCAB = 64


def logits_row(seed=0, scale=3.0):
    return torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("kwargs,match", [
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(presence_penalty=math.nan),
                                                       "presence_penalty"),
    (dict(frequency_penalty=-2.01), "frequency_penalty"), (dict(frequency_penalty="1"),
                                                           "frequency_penalty"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=math.inf), "repetition_penalty"),
    (dict(min_p=-0.1), "min_p"), (dict(min_p=1.5), "min_p"), (dict(min_p=True), "min_p"),
    (dict(logit_bias={-1: 1.0}), "logit_bias keys"), (dict(logit_bias={"5": 1.0}), "logit_bias keys"),
    (dict(logit_bias={5: 101.0}), r"logit_bias of token 5"),
    (dict(logit_bias={5: math.nan}), r"logit_bias of token 5"),
    (dict(logit_bias=[(5, 1.0), (5, 2.0)]), "twice"), (dict(logit_bias=3), "logit_bias must map"),
])
def test_bad_values_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_logit_bias_is_kept_sorted_and_hashable():
    p = SamplingParams(logit_bias={9: -1, 2: 3.5})
    assert p.logit_bias == ((2, 3.5), (9, -1.0))
    assert p == SamplingParams(logit_bias=[(2, 3.5), (9, -1.0)])
    assert hash(p) == hash(SamplingParams(logit_bias=[(9, -1.0), (2, 3.5)]))


def test_which_options_process_the_logits():
    assert not SamplingParams(0.8, top_k=5, top_p=0.9).processes_logits
    assert not SamplingParams(0.0, min_p=0.5).processes_logits  # min_p keeps the greedy token
    assert SamplingParams(0.8, min_p=0.5).processes_logits
    assert SamplingParams(logit_bias={1: 1}).processes_logits
    assert not SamplingParams(logit_bias={1: 1}).penalized
    for kw in (dict(presence_penalty=0.5), dict(frequency_penalty=-0.5),
               dict(repetition_penalty=1.2)):
        assert SamplingParams(**kw).penalized and SamplingParams(**kw).processes_logits


@pytest.mark.parametrize("penalty", [0.5, 1.3, 2.0])
@pytest.mark.parametrize("seed", range(3))
def test_repetition_penalty_equals_transformers(penalty, seed):
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    x = logits_row(seed)
    prompt, output = [1, 5, 7, 7, 30], [9, 5, 12, 63]
    ours = process_host(x, SamplingParams(0.7, repetition_penalty=penalty), prompt, output)
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt + output]), x.clone())
    assert torch.equal(ours, theirs)
    assert not torch.equal(ours, x)


@pytest.mark.parametrize("min_p,temperature", [(0.05, 1.0), (0.1, 0.7), (0.3, 1.5), (1.0, 1.0)])
@pytest.mark.parametrize("seed", range(3))
def test_min_p_keeps_what_transformers_keeps(min_p, temperature, seed):
    from transformers.generation.logits_process import MinPLogitsWarper

    x = logits_row(seed)
    ours = process_host(x, SamplingParams(temperature, min_p=min_p))
    theirs = MinPLogitsWarper(min_p)(torch.tensor([[0]]), x / temperature)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert torch.isinf(ours).any()
    kept = ~torch.isinf(ours)
    assert torch.equal(ours[kept], x[kept])  # kept logits are untouched


def test_presence_and_frequency_follow_openais_formula():
    x = logits_row(1)
    output = [3, 3, 3, 8, 20, 8]
    prompt = [4, 5]  # the prompt does not count for these two
    q, f = 0.75, -0.4
    ours = process_host(x, SamplingParams(1.0, presence_penalty=q, frequency_penalty=f),
                        prompt, output)
    expected = x.clone()
    for i in range(VOCAB):
        c = output.count(i)
        expected[0, i] = x[0, i] - c * f - (1.0 if c else 0.0) * q
    assert torch.allclose(ours, expected, atol=1e-6)
    assert torch.equal(ours[0, [4, 5]], x[0, [4, 5]])


def test_logit_bias_is_added_before_the_penalties():
    x = torch.zeros(1, VOCAB)
    x[0, 10] = -1.0
    # bias then repetition: (-1 + 3) / 2 = 1; the other order would give -1 * 2 + 3 = 1 too, so
    # take a bias that tells them apart: (-1 + 4) / 2 = 1.5 against -2 + 4 = 2.
    p = SamplingParams(1.0, repetition_penalty=2.0, logit_bias={10: 4.0, 11: -2.5})
    out = process_host(x, p, prompt=[10])
    assert out[0, 10] == 1.5 and out[0, 11] == -2.5
    assert torch.equal(out[0, 12:], x[0, 12:])


def test_bias_decides_a_greedy_choice_and_penalties_change_it():
    x = logits_row(2)
    top = int(x.argmax())
    assert sample_host(x, SamplingParams(logit_bias={7: 100}), 0, 0) == 7
    assert sample_host(x, SamplingParams(logit_bias={top: -100}), 0, 0) != top
    assert sample_host(x, SamplingParams(), 0, 0, output=[top]) == top  # no penalty asked
    assert sample_host(x, SamplingParams(presence_penalty=2.0, frequency_penalty=2.0), 0, 0,
                       output=[top] * 10) != top


def test_neutral_values_leave_the_logits_bit_for_bit():
    x = logits_row(3)
    x[0, :4] = torch.tensor([-0.0, 0.0, -1e-30, 1e-30])
    # every step runs (a presence penalty asks for them) with values that change nothing: the
    # repetition factor 1 over every token (all in the prompt), no output to count, min_p 0
    p = SamplingParams(0.9, presence_penalty=0.5, repetition_penalty=1.0, logit_bias={5: 0.5})
    assert p.penalized
    out = process_host(x, p, prompt=list(range(VOCAB)), output=[])
    expected = x.clone()
    expected[0, 5] += 0.5
    assert torch.equal(out.view(torch.int32), expected.view(torch.int32))
