"""Logit bias, penalties and min_p in ``tileinfer.generate`` (ref backend, float32 on the CPU):
every token equals the host definition (``sample_host`` with the prompt and the output so far),
on eager steps, on the static steps that CUDA graphs replay, through a capture's warm-up (a
stand-in capture that runs the warm-up and replays by running the step), and for a continued
sequence (a chat turn); parameters without them leave the runner as it was."""

from __future__ import annotations

import pytest
import torch

from tileinfer import NgramProposer, SamplingParams, forward, load_model
from tileinfer.backend.sampling import sample_host
from tileinfer.engine.generation.generate import generate, generate_into
from tileinfer.engine.generation.runner import ModelRunner
from tileinfer.engine.kv.cache import new_cache
from tileinfer.engine.runtime import static_steps
from tiny_models import prompt_ids, tiny  # noqa: F401

MAX_LEN = 160
STEPS = 24
PROCESSED = [
    SamplingParams(0.0, repetition_penalty=1.8),
    SamplingParams(0.0, presence_penalty=1.5, frequency_penalty=1.0),
    SamplingParams(1.0, top_k=40, frequency_penalty=2.0),
    SamplingParams(0.8, min_p=0.3, logit_bias={3: 5.0, 17: -100}),
    SamplingParams(0.9, top_p=0.9, repetition_penalty=1.3, presence_penalty=0.5,
                   frequency_penalty=0.3, logit_bias={40: 2.0}, min_p=0.05),
]


def load(tiny):
    return load_model(tiny.directory("llama", dtype=torch.float32), dtype=torch.float32,
                      backend="ref", max_len=MAX_LEN)


def host_tokens(model, prompt, steps, sampling, seed):
    """The definition: eager forward steps, token k from sample_host with the prompt and the k
    tokens before it."""
    cache = new_cache(model, MAX_LEN)
    seq = cache.new_sequence()
    logits, out = forward(model, cache, seq, prompt), []
    for k in range(steps):
        out.append(sample_host(logits[-1], sampling, seed, k, prompt=prompt, output=out))
        if k + 1 < steps:
            logits = forward(model, cache, seq, [out[-1]])
    return out


def plain(p: SamplingParams) -> SamplingParams:
    return SamplingParams(p.temperature, p.top_k, p.top_p)


@pytest.mark.parametrize("sampling", PROCESSED, ids=str)
def test_generate_equals_the_host_definition(tiny, sampling):
    model = load(tiny)
    prompt = prompt_ids()
    expected = host_tokens(model, prompt, STEPS, sampling, seed=5)
    assert generate(model, prompt, STEPS, sampling, stop_ids=[], seed=5) == expected
    # the options change the answer (so the comparison above means something)
    assert generate(model, prompt, STEPS, plain(sampling), stop_ids=[], seed=5) != expected


@pytest.mark.parametrize("sampling", PROCESSED[1:3] + PROCESSED[4:], ids=str)
def test_static_steps_and_prefill_buckets_equal_the_host_definition(tiny, sampling):
    model = load(tiny)
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache, static_prefill=True)  # what a graph replays, eagerly
    prompt = prompt_ids()
    for seed in (1, 2):  # the second run finds the state and the buffers made
        seq = cache.new_sequence()
        out = generate_into(runner, seq, prompt, STEPS, sampling, stop_ids=[], seed=seed)
        assert out == host_tokens(model, prompt, STEPS, sampling, seed)
        cache.release(seq)


def test_a_capture_warm_up_leaves_the_counts_as_they_were(tiny, monkeypatch):
    """Graphs on the CPU with a stand-in capture: it runs the warm-up (which samples, so would
    count a token) and replays by running the captured step."""

    class Replay:
        def __init__(self, step):
            self.replay = step

    def capture(step, warmup=None, pool=None):
        (warmup or step)()
        return Replay(step)

    monkeypatch.setattr(static_steps, "capture_graph", capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    model = load(tiny)
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache, graphs=False, static_prefill=True)
    runner.graphs = runner.steps.graphs = True
    sampling = PROCESSED[2]
    prompt = prompt_ids()
    out = generate_into(runner, cache.new_sequence(), prompt, STEPS, sampling, stop_ids=[],
                        seed=3, pipeline=False)
    assert runner.steps.captures >= 1 and runner.steps.replays > 0
    assert out == host_tokens(model, prompt, STEPS, sampling, 3)


def test_a_continued_sequence_counts_its_whole_context(tiny):
    """A chat turn continues a sequence: the repetition penalty reads everything it holds, the
    other penalties the new output only, as ``generate`` of the whole context does."""
    model = load(tiny)
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache)
    seq = cache.new_sequence()
    prompt = prompt_ids()
    first = generate_into(runner, seq, prompt[:12], 6, stop_ids=[])
    more = [first[-1]] + prompt[12:]
    sampling = PROCESSED[4]
    second = generate_into(runner, seq, more, 10, sampling, stop_ids=[], seed=9)
    context = prompt[:12] + first[:-1] + more
    assert second == generate(model, context, 10, sampling, stop_ids=[], seed=9)


def test_plain_parameters_leave_the_runner_as_it_was(tiny):
    model = load(tiny)
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache)
    generate_into(runner, cache.new_sequence(), prompt_ids(), 4, SamplingParams(0.7, min_p=0.0),
                  stop_ids=[])
    assert runner.processing is None
    assert runner._graph_key(SamplingParams(0.7, top_k=5)) == (0.7, 5, 1.0)


def test_what_generate_refuses(tiny):
    model = load(tiny)
    prompt = prompt_ids()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(model, prompt, 4, SamplingParams(logit_bias={512: 1.0}))
    with pytest.raises(ValueError, match="speculative decoding"):
        generate(model, prompt, 4, SamplingParams(presence_penalty=1.0),
                 speculative=NgramProposer())
    cache = new_cache(model, MAX_LEN)
    with pytest.raises(ValueError, match="begin_sampling"):
        ModelRunner(model, cache).forward(cache.new_sequence(), prompt,
                                          SamplingParams(repetition_penalty=1.2))
