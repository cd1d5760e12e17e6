"""The serving engine's outputs are each request's own: every request's tokens in a batch equal
``tileinfer.generate`` of it alone (float32 on the CPU), with mixed prompt lengths and chunked
prefill, with preemption forced by a tiny pool, with prefix-cache hits, greedy and sampled with
per-request seeds; the padded static decode steps that CUDA graphs replay give the same tokens."""

from __future__ import annotations

import pytest
import torch

from tileinfer import LLMEngine, SamplingParams, generate, generate_batch, load_model, runtime_of
from tileinfer.backend.registry import BackendError, get_backend
from tiny_models import prompt_ids, single_torch_thread, tiny  # noqa: F401

MAX_LEN = 128
SAMPLINGS = [SamplingParams(0.0), SamplingParams(1.0, top_k=40), SamplingParams(0.8, top_p=0.9)]


def load(tiny, arch="llama", backend="ref"):
    return load_model(tiny.directory(arch, dtype=torch.float32), dtype=torch.float32,
                      backend=backend, max_len=MAX_LEN)


def run_engine(engine, requests, check_every_step=True):
    """Add every request (dicts of add_request arguments), step to the end; returns each
    request's tokens and finish reason, checking the pool's accounting after every step."""
    ids = [engine.add_request(**r) for r in requests]
    tokens = {rid: [] for rid in ids}
    reasons = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_tokens)
            if out.finished:
                reasons[out.request_id] = out.finish_reason
        if check_every_step:
            engine.check_accounting()
    stats = engine.check_accounting()
    assert stats["running"] == stats["waiting"] == 0
    assert stats["pages_used"] == 0  # the runtime's scratch page is not one of them
    return [tokens[rid] for rid in ids], [reasons[rid] for rid in ids]


def alone(model, r):
    return generate(model, r["prompt_ids"], r["max_new_tokens"],
                    r.get("sampling", SamplingParams()), stop_ids=r.get("stop_ids", []),
                    seed=r.get("seed", 0))


def mixed_requests(lengths=(1, 5, 16, 20, 33, 47), news=(12, 20, 7, 16, 9, 14), sampling=None):
    sampling = sampling or [SamplingParams()]
    return [dict(prompt_ids=prompt_ids(n, seed=10 + i), max_new_tokens=m, stop_ids=[],
                 seed=100 + i, sampling=sampling[i % len(sampling)])
            for i, (n, m) in enumerate(zip(lengths, news))]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_greedy_batch_equals_each_request_alone(tiny, arch):
    """Mixed prompt lengths, prefill chunks of at most 24 tokens mixed with decode rows (Gemma
    3: its local layer's window of 16 slides over chunks and decode rows)."""
    model = load(tiny, arch)
    requests = mixed_requests()
    engine = LLMEngine(model, num_pages=40, page_size=16, max_step_tokens=24)
    out, reasons = run_engine(engine, requests)
    assert out == [alone(model, r) for r in requests]
    assert reasons == ["length"] * len(requests)
    stats = engine.stats()
    assert stats["preemptions"] == 0 and stats["steps"] >= 20


def test_sampled_batch_equals_each_request_alone_with_its_seed(tiny):
    model = load(tiny)
    requests = mixed_requests(sampling=SAMPLINGS)
    # Two requests sharing parameters and a seed: their rows may go in one sampling call.
    requests.append(dict(requests[1], prompt_ids=prompt_ids(9, seed=3)))
    engine = LLMEngine(model, num_pages=40, max_step_tokens=32)
    out, _ = run_engine(engine, requests)
    assert out == [alone(model, r) for r in requests]


@pytest.mark.parametrize("sampling", [SAMPLINGS[0], SAMPLINGS[2]], ids=str)
def test_preemption_changes_no_output(tiny, sampling):
    """Six pages for six requests that grow to 30-60 positions each: the newest is preempted
    again and again, recomputed from its prompt and output, and nothing is lost."""
    model = load(tiny)
    requests = mixed_requests(lengths=(20, 33, 5, 40, 17, 26), news=(30, 20, 40, 18, 30, 25),
                              sampling=[sampling])
    engine = LLMEngine(model, num_pages=6, page_size=16, max_step_tokens=40)
    out, reasons = run_engine(engine, requests)
    assert engine.stats()["preemptions"] >= 3
    assert out == [alone(model, r) for r in requests]
    assert reasons == ["length"] * len(requests)


def test_preemption_without_prefix_caching(tiny):
    model = load(tiny)
    requests = mixed_requests(lengths=(20, 33, 5, 40), news=(30, 20, 40, 18))
    engine = LLMEngine(model, num_pages=5, page_size=16, prefix_caching=False)
    out, _ = run_engine(engine, requests)
    assert engine.stats()["preemptions"] >= 1 and engine.stats()["pages_cached"] == 0
    assert out == [alone(model, r) for r in requests]


@pytest.mark.parametrize("sampling", [SAMPLINGS[0], SAMPLINGS[1]], ids=str)
def test_prefix_cache_hits_skip_prefill_and_change_no_output(tiny, sampling):
    model = load(tiny)
    shared = prompt_ids(40, seed=7)  # two full pages of 16 and 8 tokens
    first = dict(prompt_ids=shared + [1, 2, 3], max_new_tokens=10, stop_ids=[], seed=1,
                 sampling=sampling)
    engine = LLMEngine(model, num_pages=30, page_size=16)
    out1, _ = run_engine(engine, [first])
    computed = engine.stats()["computed_tokens"]
    later = [dict(first, prompt_ids=shared + prompt_ids(n, seed=20 + n), seed=5 + n)
             for n in (1, 9, 30)]
    out2, _ = run_engine(engine, later)
    stats = engine.stats()
    assert stats["prefix_hit_tokens"] == 3 * 32
    # Each later request ran its prompt minus the 32 cached tokens, and one token per output
    # token but its last.
    runs = sum(len(r["prompt_ids"]) - 32 + r["max_new_tokens"] - 1 for r in later)
    assert stats["computed_tokens"] - computed == runs
    assert out1 + out2 == [alone(model, r) for r in [first] + later]


def test_prefix_shared_by_running_requests_and_whole_cached_prompts(tiny):
    """Requests admitted while the one that computed the prefix still runs share its pages
    (references > 1); a prompt cached whole (a multiple of the page size) still runs its last
    page's worth to get logits and writes nothing into a shared page."""
    model = load(tiny)
    shared = prompt_ids(32, seed=8)
    base = dict(max_new_tokens=20, stop_ids=[], seed=3)
    requests = [dict(base, prompt_ids=shared + prompt_ids(5, seed=1)),
                dict(base, prompt_ids=list(shared)),  # all of it in cached pages
                dict(base, prompt_ids=shared + prompt_ids(17, seed=2))]
    engine = LLMEngine(model, num_pages=30, page_size=16, max_step_tokens=64)
    ids = [engine.add_request(**requests[0])]
    outputs = engine.step()  # the first request's prompt: both shared pages published
    ids += [engine.add_request(**r) for r in requests[1:]]
    outputs += engine.step()
    alloc = engine.cache.allocator
    first_pages = engine._requests[ids[0]].seq.pages
    assert alloc.refcount(first_pages[0]) == 3 and alloc.refcount(first_pages[1]) == 2
    assert engine._requests[ids[1]].cached_prompt_tokens == 16
    assert engine._requests[ids[2]].cached_prompt_tokens == 32
    while engine.has_unfinished():
        outputs += engine.step()
        engine.check_accounting()
    tokens = {rid: [t for o in outputs if o.request_id == rid for t in o.new_tokens] for rid in ids}
    assert [tokens[rid] for rid in ids] == [alone(model, r) for r in requests]


def test_int8_weights_and_int8_kv_pages(tiny):
    """INT8 weights and an INT8 KV cache (with prefix sharing and preemption) in batched steps:
    each request as alone with the same cache precision."""
    model = load_model(tiny.directory("qwen3", dtype=torch.float32), dtype=torch.float32,
                       max_len=MAX_LEN, quantize="int8")
    shared = prompt_ids(32, seed=6)
    requests = [dict(prompt_ids=shared + prompt_ids(n, seed=n), max_new_tokens=m, stop_ids=[],
                     seed=n, sampling=SAMPLINGS[n % 3]) for n, m in ((3, 20), (11, 25), (20, 15))]
    engine = LLMEngine(model, num_pages=7, kv_quantize="int8", max_step_tokens=40)
    out, _ = run_engine(engine, requests)
    assert engine.stats()["prefix_hit_tokens"] > 0 and engine.stats()["preemptions"] > 0
    assert out == [generate(model, r["prompt_ids"], r["max_new_tokens"], r["sampling"],
                            stop_ids=[], seed=r["seed"], kv_quantize="int8") for r in requests]


def test_cached_pages_are_evicted_least_recently_released_first(tiny):
    model = load(tiny)
    engine = LLMEngine(model, num_pages=8, page_size=16, watermark=0)
    a, b = prompt_ids(40, seed=1), prompt_ids(40, seed=2)
    run_engine(engine, [dict(prompt_ids=a, max_new_tokens=2, stop_ids=[])])
    run_engine(engine, [dict(prompt_ids=b, max_new_tokens=2, stop_ids=[])])
    assert engine.stats()["pages_cached"] == 4  # two full pages each
    # A request needing 6 of the 8 pages: 4 free ones, then a's two pages (released first).
    run_engine(engine, [dict(prompt_ids=prompt_ids(90, seed=3), max_new_tokens=1, stop_ids=[])])
    hits = engine.stats()["prefix_hit_tokens"]
    run_engine(engine, [dict(prompt_ids=b + [5], max_new_tokens=1, stop_ids=[])])
    assert engine.stats()["prefix_hit_tokens"] - hits == 32  # b's pages survived
    run_engine(engine, [dict(prompt_ids=a + [5], max_new_tokens=1, stop_ids=[])])
    assert engine.stats()["prefix_hit_tokens"] - hits == 32  # a's did not


def test_stop_ids_and_max_len(tiny):
    model = load(tiny)
    prompt = prompt_ids(20, seed=4)
    free = generate(model, prompt, 30, stop_ids=[])
    stop = free[12]
    engine = LLMEngine(model, num_pages=30)
    rid = engine.add_request(prompt, max_new_tokens=30, stop_ids=[stop])
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert [t for o in outputs for t in o.new_tokens] == free[:free.index(stop)]
    last = outputs[-1]
    assert (last.request_id, last.finished, last.finish_reason, last.stop_token,
            last.new_tokens) == (rid, True, "stop", stop, [])
    # A prompt of max_len - 2 tokens: three tokens fit (the last one is never run).
    long = prompt_ids(MAX_LEN - 2, seed=5)
    out, reasons = run_engine(engine, [dict(prompt_ids=long, max_new_tokens=50, stop_ids=[])])
    assert reasons == ["length"] and len(out[0]) == 3
    assert out[0] == generate(model, long, 2, stop_ids=[]) + out[0][2:]


def test_static_padded_decode_steps_give_the_eager_tokens(tiny):
    """The decode steps CUDA graphs replay (padded to a bucket, padding rows on the scratch
    page), run eagerly on the CPU: the same tokens as unpadded steps."""
    model = load(tiny)
    requests = mixed_requests(sampling=SAMPLINGS)
    engine = LLMEngine(model, num_pages=40, max_running=8, static_decode=True)
    engine.runner.warmup([1, 8])  # steps of padding rows only: they touch no sequence
    assert engine.check_accounting()["pages_used"] == 0  # the scratch page is the runtime's
    out, _ = run_engine(engine, requests)
    assert engine.runner.scratch_page is not None and engine.runner.buckets == [1, 2, 4, 8]
    assert engine.runner.static_decode_sizes() == [1, 2, 4, 8]  # 6 -> 8 ... 1 as requests finish
    assert out == [alone(model, r) for r in requests]


def test_generate_batch(tiny):
    model = load(tiny)
    prompts = [prompt_ids(n, seed=n) for n in (3, 18, 7)]
    samplings = [SAMPLINGS[0], SAMPLINGS[2], SAMPLINGS[1]]
    out = generate_batch(model, prompts, samplings, max_new_tokens=[5, 9, 6], stop_ids=[],
                         seeds=[1, 2, 3], max_running=2, max_step_tokens=8)
    assert out == [generate(model, p, m, s, stop_ids=[], seed=seed)
                   for p, s, m, seed in zip(prompts, samplings, [5, 9, 6], [1, 2, 3])]
    assert generate_batch(model, []) == []
    with pytest.raises(ValueError, match="seeds: 2 values for 3 prompts"):
        generate_batch(model, prompts, seeds=[1, 2])


@pytest.mark.parametrize("bad, error, message", [
    (dict(prompts=["5678"]), TypeError, r"prompts\[0\] must be a sequence of token ids .*a str"),
    (dict(prompts=[[1, 2], [5.9, 6.9]]), TypeError, r"prompts\[1\] .*got 5.9 at index 0"),
    (dict(stop_ids=["24"]), TypeError, "stop_ids must be a sequence .*got '24' at index 0"),
    (dict(stop_ids=[10 ** 6]), ValueError, "stop_ids: token id 1000000 is outside"),
])
def test_generate_batch_refuses_what_is_not_token_ids_before_making_an_engine(tiny, bad, error,
                                                                              message):
    model = load(tiny)
    prompts = [prompt_ids(n, seed=n) for n in (3, 18)]
    expected = generate_batch(model, prompts, max_new_tokens=5, stop_ids=[], seeds=[1, 2])
    runtime = runtime_of(model)
    pool, pages, builds = runtime.cache, runtime.cache.num_pages, runtime.pool_builds
    with pytest.raises(error, match=message):
        generate_batch(model, **dict(dict(prompts=prompts, max_new_tokens=5, stop_ids=[]), **bad))
    assert (runtime.cache, pool.num_pages, runtime.pool_builds) == (pool, pages, builds)
    assert generate_batch(model, prompts, max_new_tokens=5, stop_ids=[], seeds=[1, 2]) == expected


@pytest.mark.slow
def test_triton_backend_under_the_interpreter(tiny):
    """One small case on the triton backend (TRITON_INTERPRET=1 on the CPU, as CI runs it): two
    prompts in one step, each sampling its token with its own parameters and stream. (Under the
    interpreter a step takes seconds, and steps of 2 to 16 rows tens of seconds, so this is
    kept to steps of 1 or more than 16 rows.)"""
    try:
        get_backend("triton")
    except BackendError as e:
        pytest.skip(str(e))
    model = load(tiny, backend="triton")
    requests = mixed_requests(lengths=(20, 18), news=(1, 1), sampling=SAMPLINGS[1:])
    engine = LLMEngine(model, num_pages=6, page_size=16)
    out, _ = run_engine(engine, requests)
    assert engine.stats()["steps"] == 1
    assert out == [alone(model, r) for r in requests]
