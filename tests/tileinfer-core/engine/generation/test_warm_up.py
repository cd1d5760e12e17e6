"""warm_up: a short generation that makes the runtime's pool and steps, and changes no answer
that comes after it (greedy, seeded sampling, INT8 KV)."""

from __future__ import annotations

import pytest
import torch

from tileinfer import SamplingParams, generate, load_model, runtime_of, warm_up
from tileinfer.engine.generation.warm_up import NEW_TOKENS, PROMPT_TOKENS
from tiny_models import prompt_ids, single_torch_thread, tiny  # noqa: F401

MAX_LEN = 96


def fresh(tiny):
    return load_model(tiny.directory("llama"), dtype=torch.float32, max_len=MAX_LEN)


@pytest.mark.parametrize("sampling,kv", [
    (SamplingParams(), None),
    (SamplingParams(temperature=0.8, top_k=20, repetition_penalty=1.2), None),
    (SamplingParams(), "int8"),
])
def test_answers_after_a_warm_up_equal_those_without(tiny, sampling, kv):
    prompt = prompt_ids(13, seed=4)
    cold = generate(fresh(tiny), prompt, 10, sampling, stop_ids=[], seed=5, kv_quantize=kv)
    model = fresh(tiny)
    warm_up(model, sampling, kv_quantize=kv)
    runtime = runtime_of(model)
    steps, pool = list(runtime.steps.steps()), runtime.cache
    assert steps and pool is not None and runtime.live_pages() == 0
    assert (pool.quantize == "int8") == (kv == "int8")
    assert generate(model, prompt, 10, sampling, stop_ids=[], seed=5, kv_quantize=kv) == cold
    assert runtime.cache is pool and runtime.pool_builds == 1  # the answer used what it made


def test_warm_up_leaves_out_a_grammar_and_skips_a_too_short_model(tiny):
    class Structure:  # stands for a compiled grammar; warm_up must not hand it to generate
        pass

    model = fresh(tiny)
    sampling = SamplingParams()
    object.__setattr__(sampling, "structure", Structure())
    warm_up(model, sampling)
    assert runtime_of(model).live_pages() == 0
    short = load_model(tiny.directory("llama"), dtype=torch.float32,
                       max_len=PROMPT_TOKENS + NEW_TOKENS - 1)
    warm_up(short)
    assert short.attachments.get("runtime") is None  # nothing run, nothing made


def test_warm_up_makes_the_one_token_decode_step(tiny):
    model = fresh(tiny)
    assert runtime_of(model).steps.find(("seq", 1, False, ())) is None
    warm_up(model)
    assert runtime_of(model).steps.find(("seq", 1, False, ())) is not None
