"""warm_up: a short generation that makes the runtime's pool and steps, and changes no answer
that comes after it (greedy, seeded sampling, INT8 KV)."""

from __future__ import annotations

import pytest
import torch

from gpu_params import gpu_backends
from tileinfer import NgramProposer, SamplingParams, generate, load_model, runtime_of, warm_up
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


def test_a_proposer_name_is_refused_before_anything_runs(tiny):
    model = fresh(tiny)
    with pytest.raises(TypeError, match=r"speculative takes a proposer object: "
                                        r"tileinfer.NgramProposer\(\)"):
        warm_up(model, speculative="ngram")
    assert model.attachments.get("runtime") is None  # nothing run, nothing made
    warm_up(model, speculative=NgramProposer(k=3))
    assert runtime_of(model).steps.find(("seq", 1, False, ())) is not None


def test_warm_up_makes_the_one_token_decode_step(tiny):
    model = fresh(tiny)
    assert runtime_of(model).steps.find(("seq", 1, False, ())) is None
    warm_up(model)
    assert runtime_of(model).steps.find(("seq", 1, False, ())) is not None


def test_a_speculative_warm_up_on_the_cpu_changes_no_answer(tiny):
    """On the CPU there is nothing to capture: the warm-up with a proposer is the plain one, and
    the n-gram answer after it equals plain greedy decoding's."""
    prompt = prompt_ids(13, seed=4) * 2  # repeats itself: the lookup has something to draft
    model = fresh(tiny)
    plain = generate(model, prompt, 12, stop_ids=[], seed=5)
    warm_up(model, speculative=NgramProposer(k=3))
    assert runtime_of(model).live_pages() == 0
    assert generate(model, prompt, 12, stop_ids=[], seed=5,
                    speculative=NgramProposer(k=3)) == plain


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8)])
def test_a_speculative_warm_up_captures_every_verify_step_and_times_it(tiny, backend, sampling):
    """After warm_up with an n-gram proposer, the first speculative answer captures no graph
    (every step size it may run was captured), the cost model holds a measured cost of each
    size, and greedy answers equal plain greedy decoding's."""
    model = load_model(tiny.directory("llama", dtype=torch.bfloat16), dtype=torch.bfloat16,
                       backend=backend, max_len=MAX_LEN, device="cuda")
    k = 5
    warm_up(model, sampling, speculative=NgramProposer(k=k))
    runtime = runtime_of(model)
    assert runtime.live_pages() == 0
    assert sorted(runtime.step_seconds) == list(range(1, k + 2))
    assert all(len(v) == 3 and all(s > 0 for s in v) for v in runtime.step_seconds.values())
    for n in range(2, k + 2):
        assert runtime.steps.find(("seq", n, True, ())).graphs
    prompt = prompt_ids(20, seed=2) * 2  # 40 tokens, + 40 new within MAX_LEN
    captures = runtime.steps.captures
    out = generate(model, prompt, 40, sampling, stop_ids=[], seed=3,
                   speculative=NgramProposer(k=k))
    # The prompt's bucket runs eagerly on its first use (captured on its second), and every
    # step of the loop was captured by the warm-up.
    assert runtime.steps.captures == captures
    if sampling.greedy:
        assert out == generate(model, prompt, 40, stop_ids=[], seed=3)
