"""Generation: generate / generate_into against plain eager decoding, stop ids, max_new_tokens,
the sequence's contents afterwards, seeds, errors that leave the sequence as it was; the CUDA-graph
and pipelined paths produce exactly the eager tokens (GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tileinfer import OutOfPagesError, SamplingParams, forward, load_model, runtime_of
from tileinfer.backend.sampling import sample_host
from tileinfer.engine.kv.cache import new_cache
from tileinfer.engine.generation.generate import generate, generate_into
from tileinfer.engine.generation.runner import ModelRunner
from tiny_models import prompt_ids, tiny  # noqa: F401

MAX_LEN = 160
SAMPLINGS = [SamplingParams(0.0), SamplingParams(1.0, top_k=40), SamplingParams(0.8, top_p=0.9)]


def load(tiny, backend="ref", arch="llama", dtype=torch.float32, device=None):
    return load_model(tiny.directory(arch, dtype=dtype), dtype=dtype, backend=backend,
                      max_len=MAX_LEN, device=device)


def eager_tokens(model, prompt, steps, sampling, seed, stop=()):
    """The definition: eager forward steps, each token from sample_host(logits, seed, k)."""
    cache = new_cache(model, MAX_LEN)
    seq = cache.new_sequence()
    logits, out = forward(model, cache, seq, prompt), []
    for k in range(steps):
        token = sample_host(logits[-1], sampling, seed, k)
        if token in stop:
            break
        out.append(token)
        if k + 1 < steps:
            logits = forward(model, cache, seq, [token])
    return out


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
def test_generate_matches_eager_sampling_on_the_host(tiny, sampling):
    model = load(tiny)
    prompt = prompt_ids()
    expected = eager_tokens(model, prompt, 24, sampling, seed=7)
    assert generate(model, prompt, 24, sampling, stop_ids=[], seed=7) == expected


def test_stop_token_ends_generation_and_sequence_holds_all_but_the_last(tiny):
    model = load(tiny)
    prompt = prompt_ids()
    free = eager_tokens(model, prompt, 30, SamplingParams(), seed=0)
    stop = free[10]  # the 11th greedy token becomes a stop token
    first = free.index(stop)
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache)
    seq = cache.new_sequence()
    streamed = []
    out = generate_into(runner, seq, prompt, 30, stop_ids=[stop], on_token=streamed.append)
    assert out == free[:first] == streamed
    # The stop token was sampled but never run: the sequence holds prompt + out.
    assert seq.tokens == prompt + out
    # max_new_tokens: the last token is returned but never run.
    seq2 = cache.new_sequence()
    out2 = generate_into(runner, seq2, prompt, 5, stop_ids=[])
    assert out2 == free[:5] and seq2.tokens == prompt + free[:4]


def test_continuing_a_sequence_equals_one_long_generation(tiny):
    model = load(tiny)
    prompt = prompt_ids()
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache)
    seq = cache.new_sequence()
    first = generate_into(runner, seq, prompt, 8, stop_ids=[])
    second = generate_into(runner, seq, [first[-1]], 8, stop_ids=[])
    assert first + second == eager_tokens(model, prompt, 16, SamplingParams(), seed=0)


def test_out_of_pages_leaves_the_sequence_as_it_was(tiny):
    model = load(tiny)
    cache = new_cache(model, num_pages=3, page_size=16)  # 48 positions
    runner = ModelRunner(model, cache)
    seq = cache.new_sequence()
    prompt = prompt_ids()
    generate_into(runner, seq, prompt, 4, stop_ids=[])
    tokens, pages, free = list(seq.tokens), list(seq.pages), cache.free_pages
    with pytest.raises(OutOfPagesError):
        generate_into(runner, seq, [1], 40, stop_ids=[])
    assert (seq.tokens, seq.pages, cache.free_pages) == (tokens, pages, free)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_max_new_tokens(tiny, bad):
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(load(tiny), prompt_ids(), bad)


def test_prompt_longer_than_max_len_is_refused(tiny):
    with pytest.raises(ValueError, match="max_len"):
        generate(load(tiny), list(range(MAX_LEN)), 4)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(pipeline=True), ValueError,
     r"pipelined decoding \(pipeline=True\) needs a model on a CUDA device"),
    (dict(page_size=0), ValueError, "num_pages and page_size must be >= 1, got None, 0"),
    (dict(page_size=-1), ValueError, "num_pages and page_size must be >= 1, got None, -1"),
    (dict(prompt_ids="5678"), TypeError, "prompt_ids must be a sequence of token ids .*a str"),
    (dict(prompt_ids=[5.9, 6.9]), TypeError, "prompt_ids must be .*got 5.9 at index 0"),
    (dict(prompt_ids=[5, True]), TypeError, "prompt_ids must be .*got True at index 1"),
    (dict(prompt_ids=[5, 512]), ValueError, "prompt_ids: token id 512 is outside the vocab"),
    (dict(stop_ids=["24"]), TypeError, "stop_ids must be a sequence .*got '24' at index 0"),
    (dict(stop_ids=[10 ** 6]), ValueError, "stop_ids: token id 1000000 is outside the vocab"),
    (dict(stop_ids=[-1]), ValueError, "stop_ids: token id -1 is outside the vocabulary"),
    (dict(seed=2 ** 64), ValueError, "seed must be an integer in the int64 range, got 1844"),
    (dict(seed=1.5), ValueError, "seed must be an integer in the int64 range, got 1.5"),
    (dict(seed=True), ValueError, "seed must be an integer in the int64 range, got True"),
    (dict(max_new_tokens=True), ValueError, "max_new_tokens must be a positive integer"),
    (dict(speculative="ngram"), TypeError,
     r"speculative takes a proposer object: tileinfer.NgramProposer\(\), .*DraftProposer"),
    (dict(kv_quantize="int8", key_smoothing="x"), TypeError,
     "key_smoothing must hold one .*tileinfer.calibrate_key_smoothing gives; got a str"),
])
def test_bad_arguments_are_refused_before_anything_changes(tiny, kwargs, error, message):
    model = load(tiny)
    prompt = prompt_ids()
    expected = generate(model, prompt, 6, stop_ids=[], seed=5)
    runtime = runtime_of(model)
    pool, pages, builds = runtime.cache, runtime.cache.num_pages, runtime.pool_builds
    with pytest.raises(error, match=message):
        generate(model, **dict(dict(prompt_ids=prompt, max_new_tokens=6, stop_ids=[], seed=5),
                               **kwargs))
    assert (runtime.cache, pool.num_pages, runtime.pool_builds) == (pool, pages, builds)
    assert runtime.live_pages() == 0
    assert generate(model, prompt, 6, stop_ids=[], seed=5) == expected


def test_integer_scalars_of_numpy_and_torch_are_token_ids_and_seeds(tiny):
    model = load(tiny)
    prompt = prompt_ids()
    free = generate(model, prompt, 30, stop_ids=[], seed=0)
    stop = free[10]
    expected = free[:free.index(stop)]
    for stop_ids in ([stop], [np.int64(stop)], torch.tensor([stop]), (torch.tensor(stop),)):
        assert generate(model, prompt, 30, stop_ids=stop_ids, seed=0) == expected
    assert generate(model, torch.tensor(prompt), 30, stop_ids=[stop], seed=np.int64(0)) == \
        expected
    assert generate(model, np.array(prompt), 30, stop_ids=[stop], seed=torch.tensor(0)) == \
        expected


def test_generate_into_refuses_bad_ids_and_leaves_the_sequence_as_it_was(tiny):
    model = load(tiny)
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache)
    seq = cache.new_sequence()
    prompt = prompt_ids()
    first = generate_into(runner, seq, prompt, 4, stop_ids=[])
    before = (list(seq.tokens), list(seq.pages), cache.free_pages)
    for bad, error, message in [(dict(ids="12"), TypeError, "ids must be a sequence of token"),
                                (dict(stop_ids=["24"]), TypeError, "stop_ids must be"),
                                (dict(seed=2 ** 63), ValueError, "seed must be an integer")]:
        with pytest.raises(error, match=message):
            generate_into(runner, seq, **dict(dict(ids=[first[-1]], max_new_tokens=4,
                                                   stop_ids=[]), **bad))
        assert (seq.tokens, seq.pages, cache.free_pages) == before
    second = generate_into(runner, seq, [first[-1]], 4, stop_ids=[])
    assert first + second == eager_tokens(model, prompt, 8, SamplingParams(), seed=0)


def gpu_backends():
    from tileinfer.backend.registry import list_backends

    names = [b.name for b in list_backends() if b.available and "cuda" in b.info.devices
             and b.info.graph_safe]
    return [pytest.param(n, marks=pytest.mark.gpu) for n in names] or [
        pytest.param("none", marks=pytest.mark.skip(reason="no graph-safe GPU backend"))]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
def test_graphs_and_pipelining_give_the_eager_tokens(tiny, backend, sampling):
    model = load(tiny, backend, dtype=torch.bfloat16, device="cuda")
    prompt = prompt_ids()
    results = {}
    for graphs, pipeline in [(False, False), (True, False), (True, True)]:
        cache = new_cache(model, MAX_LEN)
        runner = ModelRunner(model, cache, graphs=graphs)
        seq = cache.new_sequence()
        out = generate_into(runner, seq, prompt, 60, sampling, stop_ids=[], seed=11,
                            pipeline=pipeline)
        results[(graphs, pipeline)] = (out, list(seq.tokens))
    eager = results[(False, False)]
    assert results[(True, False)] == eager
    assert results[(True, True)] == eager
    # And the eager device sampler equals the host definition.
    assert eager[0] == eager_tokens(model, prompt, 60, sampling, seed=11)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
def test_pipelined_decoding_honours_stop_ids_exactly(tiny, backend):
    model = load(tiny, backend, dtype=torch.bfloat16, device="cuda")
    prompt = prompt_ids()
    free = generate(model, prompt, 40, stop_ids=[], pipeline=False, graphs=False)
    stop = free[17]
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache, graphs=True)
    seq = cache.new_sequence()
    out = generate_into(runner, seq, prompt, 40, stop_ids=[stop], pipeline=True)
    assert out == free[:free.index(stop)]
    assert seq.tokens == prompt + out
    assert cache.free_pages == cache.num_pages - cache.pages_for(len(seq))
