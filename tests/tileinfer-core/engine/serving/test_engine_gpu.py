"""The serving engine on a GPU: decode steps replayed from CUDA graphs (padded to a bucket) give
exactly the tokens of the same padded steps run eagerly; batch 1 with graphs gives exactly
``tileinfer.generate``'s tokens; float32 batches equal each request alone; the pool is sized from
the free GPU memory."""

from __future__ import annotations

import pytest
import torch
from gpu_params import gpu_backends

from tileinfer import LLMEngine, SamplingParams, generate, kv_pool_pages, load_model
from tiny_models import prompt_ids, tiny  # noqa: F401

MAX_LEN = 160
SAMPLINGS = [SamplingParams(0.0), SamplingParams(1.0, top_k=40), SamplingParams(0.8, top_p=0.9)]


def load(tiny, backend, dtype=torch.bfloat16):
    return load_model(tiny.directory("llama", dtype=dtype), dtype=dtype, backend=backend,
                      max_len=MAX_LEN, device="cuda")


def requests(sampling=True):
    lengths, news = (1, 5, 16, 20, 33, 47, 9, 70, 2), (40, 25, 30, 12, 45, 20, 33, 15, 50)
    return [dict(prompt_ids=prompt_ids(n, seed=40 + i), max_new_tokens=m, stop_ids=[],
                 seed=7 + i, sampling=SAMPLINGS[i % 3] if sampling else SamplingParams())
            for i, (n, m) in enumerate(zip(lengths, news))]


def run(engine, reqs):
    ids = [engine.add_request(**r) for r in reqs]
    tokens = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.finish_reason != "error", out.error
            tokens[out.request_id] += out.new_tokens
    stats = engine.check_accounting()
    assert stats["pages_used"] == 0
    return [tokens[rid] for rid in ids]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
def test_graph_replays_equal_the_same_steps_run_eagerly(tiny, backend):
    model = load(tiny, backend)
    reqs = requests()
    # Without prefix caching: the second engine would find the first one's prompts in the
    # model's pool, and steps of other shapes may round differently in bf16.
    graphed = LLMEngine(model, num_pages=64, max_running=8, max_step_tokens=64, graphs=True,
                        prefix_caching=False, static_mixed=False)
    out = run(graphed, reqs)
    assert graphed.stats()["graph_replays"] > 50
    eager = LLMEngine(model, num_pages=64, max_running=8, max_step_tokens=64, graphs=False,
                      static_decode=True, prefix_caching=False)
    assert run(eager, reqs) == out
    graphed.close()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
def test_batch_of_one_with_graphs_equals_generate(tiny, backend):
    model = load(tiny, backend)
    engine = LLMEngine(model, num_pages=64, max_running=1, graphs=True)
    reqs = requests()[:4]
    assert run(engine, reqs) == [
        generate(model, r["prompt_ids"], r["max_new_tokens"], r["sampling"], stop_ids=[],
                 seed=r["seed"]) for r in reqs]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends(("ref", "triton")))
def test_float32_batch_equals_each_request_alone(tiny, backend):
    model = load(tiny, backend, torch.float32)
    reqs = requests()
    engine = LLMEngine(model, num_pages=23, max_running=8, max_step_tokens=48)  # preempts
    out = run(engine, reqs)
    assert engine.stats()["preemptions"] > 0
    assert out == [generate(model, r["prompt_ids"], r["max_new_tokens"], r["sampling"],
                            stop_ids=[], seed=r["seed"]) for r in reqs]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
def test_pool_is_sized_from_free_gpu_memory(tiny, backend):
    """A fraction that leaves about 3 GiB beyond what is in use gets a pool of at most that
    (the activations' reserve comes off it); one that leaves nothing is refused. (Other test
    processes on the GPU may allocate meanwhile, so the bounds are loose.)"""
    model = load(tiny, backend)
    free, total = torch.cuda.mem_get_info()
    fraction = min(1.0, (total - free + 3 * 2**30) / total)
    pages = kv_pool_pages(model, fraction=fraction, max_batch=8)
    c = model.config
    page_bytes = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 2 * 16  # bf16, 16 positions
    assert 0 < pages * page_bytes <= 3 * 2**30
    with pytest.raises(ValueError, match="no memory left for the KV cache"):
        kv_pool_pages(model, fraction=(total - free) / total / 2)
    engine = LLMEngine(model, memory_fraction=fraction, max_running=8)
    # The pool's pages for requests: all but the runtime's scratch page.
    assert engine.stats()["pages_total"] == engine.cache.num_pages - 1 > 0
    assert run(engine, requests()[:2])
    engine.close()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
def test_engines_of_other_pool_sizes_one_after_another(tiny, backend):
    """A later engine of another size makes the KV pool anew, which drops every CUDA graph; the
    next captures take a new graph pool (joining the old one, whose graphs are all gone, made
    PyTorch's allocator assert)."""
    model = load(tiny, backend)
    reqs = requests(sampling=False)[:4]
    first = run(LLMEngine(model, num_pages=60), reqs)
    assert run(LLMEngine(model, num_pages=12), reqs) == first
    assert run(LLMEngine(model, num_pages=60), reqs) == first


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
def test_a_second_generate_batch_call_captures_nothing(tiny, backend):
    """generate_batch of one wave runs its prefill eagerly: the second call of the same batch
    replays the decode steps the first captured and captures nothing (a prefill captured on
    its shape's second use would cost the second call more than it saves)."""
    from tileinfer import generate_batch
    from tileinfer.engine.runtime.runtime import runtime_of

    model = load(tiny, backend)
    prompts = [prompt_ids(16, seed=60 + i) for i in range(8)]
    # A pool of its own size: one sized from the free memory would starve the tests that run
    # beside this one (the runtime keeps its pool after the engine closes).
    first = generate_batch(model, prompts, max_new_tokens=24, stop_ids=[], num_pages=64)
    steps = runtime_of(model).steps
    captures, replays = steps.captures, steps.replays
    assert captures > 0  # the decode steps
    again = generate_batch(model, prompts, max_new_tokens=24, stop_ids=[], num_pages=64)
    assert again == first
    assert steps.captures == captures and steps.replays > replays
    model.close()
