"""The serving engine under bad input and faults: refused requests take no pages, aborts free
pages at once, a failing step fails only its requests and the engine serves the next ones, the
pool's accounting holds after every kind of ending; the background thread; pool sizing."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from tileinfer import (EngineThread, LLMEngine, RequestError, SamplingParams, generate,
                       kv_pool_pages, load_model, runtime_of)
from tiny_models import prompt_ids, single_torch_thread, tiny  # noqa: F401

MAX_LEN = 128


@pytest.fixture(scope="module")
def model(tiny):
    return load_model(tiny.directory("llama", dtype=torch.float32), dtype=torch.float32,
                      backend="ref", max_len=MAX_LEN)


def drain(engine, outputs=None):
    outputs = [] if outputs is None else outputs
    while engine.has_unfinished():
        outputs += engine.step()
        engine.check_accounting()
    return outputs


def tokens_of(outputs, rid):
    return [t for o in outputs if o.request_id == rid for t in o.new_tokens]


def finish_of(outputs, rid):
    (last,) = [o for o in outputs if o.request_id == rid and o.finished]
    return last


def _mutated_sampling():
    params = SamplingParams(0.5)
    object.__setattr__(params, "top_p", 1.5)  # around the frozen dataclass's check
    return params


@pytest.mark.parametrize("kwargs, message", [
    (dict(prompt_ids=[]), "at least one token"),
    (dict(prompt_ids=[1, 512]), "token id 512 is outside the vocabulary"),
    (dict(prompt_ids="abc"), "prompt_ids must be a sequence of token ids .*got a str"),
    (dict(prompt_ids=[5.9, 6.9]), "prompt_ids must be a sequence .*got 5.9 at index 0"),
    (dict(prompt_ids=[1, True]), "prompt_ids must be a sequence .*got True at index 1"),
    (dict(prompt_ids=list(range(MAX_LEN + 1))), f"129 tokens; the model's max_len is {MAX_LEN}"),
    (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
    (dict(max_new_tokens=2.5), "max_new_tokens must be a positive integer"),
    (dict(sampling={"temperature": 1.0}), "sampling must be a tileinfer.SamplingParams"),
    (dict(sampling=_mutated_sampling()), "top_p must be in"),
    (dict(seed=2 ** 63), "seed must be an integer in the int64 range"),
    (dict(seed="7"), "seed must be an integer"),
    (dict(seed=1.5), "seed must be an integer in the int64 range, got 1.5"),
    (dict(stop_ids=["x"]), "stop_ids must be a sequence of token ids"),
    (dict(stop_ids=["24"]), "stop_ids must be a sequence .*got '24' at index 0"),
    (dict(stop_ids=[10 ** 6]), "stop_ids: token id 1000000 is outside the vocabulary"),
    (dict(stop_ids=[-1]), "stop_ids: token id -1 is outside the vocabulary"),
    (dict(max_new_tokens=200), "needs up to 8 KV pages \\(128 positions"),  # min(5 + 199, 128)
    (dict(logprobs=21), "logprobs must be None or an integer in 0..20, got 21"),
    (dict(logprobs=True), "logprobs must be None or an integer"),
])
def test_bad_requests_are_refused_before_taking_anything(model, kwargs, message):
    engine = LLMEngine(model, num_pages=7, page_size=16)
    args = dict(dict(prompt_ids=[1, 2, 3, 4, 5], max_new_tokens=4), **kwargs)
    before = engine.stats()
    with pytest.raises(RequestError, match=message):
        engine.add_request(**args)
    assert engine.stats() == before and not engine.has_unfinished()
    assert isinstance(RequestError("x"), ValueError)


def test_refused_requests_leave_the_engine_serving_as_before(model):
    engine = LLMEngine(model, num_pages=7, page_size=16)
    for bad in (dict(prompt_ids="5678"), dict(stop_ids=["24"]), dict(seed=2 ** 64)):
        with pytest.raises(RequestError):
            engine.add_request(**dict(dict(prompt_ids=[5, 6, 7, 8], max_new_tokens=6), **bad))
    # Integer scalars of numpy and torch are token ids and seeds as Python ints are.
    rid = engine.add_request(torch.tensor([5, 6, 7, 8]), max_new_tokens=6, stop_ids=[],
                             seed=torch.tensor(3))
    assert tokens_of(drain(engine), rid) == generate(model, [5, 6, 7, 8], 6, stop_ids=[], seed=3)
    engine.close()


def test_a_request_as_large_as_the_pool_is_served(model):
    prompt = prompt_ids(20)
    # before the engine: a generate beside an open engine grows the engine's pool
    expected = generate(model, prompt, 13, stop_ids=[])
    engine = LLMEngine(model, num_pages=2, page_size=16)
    rid = engine.add_request(prompt, max_new_tokens=13, stop_ids=[])  # 32 positions
    out = drain(engine)
    assert tokens_of(out, rid) == expected
    with pytest.raises(RequestError, match="needs up to 3 KV pages"):
        engine.add_request(prompt, max_new_tokens=14)


def test_abort_frees_pages_at_once_wherever_the_request_is(model):
    engine = LLMEngine(model, num_pages=20, page_size=16, max_running=2)
    ids = [engine.add_request(prompt_ids(30, seed=i), max_new_tokens=40, stop_ids=[])
           for i in range(4)]
    outputs = engine.step() + engine.step()
    stats = engine.check_accounting()
    assert (stats["running"], stats["waiting"]) == (2, 2) and stats["pages_used"] == 4
    assert engine.abort(ids[0])  # running: its pages go back now, not at the next step
    stats = engine.check_accounting()
    assert (stats["running"], stats["pages_used"]) == (1, 2)
    assert stats["pages_cached"] == 1  # its one full page (of 16 prompt tokens) stays cached
    assert engine.abort(ids[3])  # waiting
    assert engine.check_accounting()["waiting"] == 1
    assert not engine.abort(ids[3]) and not engine.abort(999)  # already aborted / unknown
    late = engine.add_request([1, 2, 3], max_new_tokens=2)
    assert engine.abort(late)  # still in the queue the step takes requests from
    outputs += drain(engine)
    for rid in (ids[0], ids[3], late):
        assert finish_of(outputs, rid).finish_reason == "abort"
    assert [finish_of(outputs, rid).finish_reason for rid in ids[1:3]] == ["length"] * 2
    assert tokens_of(outputs, ids[1]) == generate(model, prompt_ids(30, seed=1), 40, stop_ids=[])
    assert engine.stats()["pages_used"] == 0


def test_abort_during_a_step_takes_effect_when_it_ends(model):
    engine = LLMEngine(model, num_pages=20)
    rid = engine.add_request(prompt_ids(10), max_new_tokens=30, stop_ids=[])
    engine.step()
    held, release = threading.Event(), threading.Event()

    def step_in_flight():  # holds the step lock as a step on the engine's thread would
        with engine._step_lock:
            held.set()
            release.wait(10)

    other = threading.Thread(target=step_in_flight)
    other.start()
    held.wait(10)
    assert engine.abort(rid) and not engine.abort(rid)
    assert engine.stats()["running"] == 1  # not yet: the step in flight holds its pages
    release.set()
    other.join()
    outputs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outputs] == [(rid, "abort")]
    assert engine.check_accounting()["pages_used"] == 0 and not engine.has_unfinished()


@pytest.mark.parametrize("error", [RuntimeError("kernel fault"),
                                   torch.cuda.OutOfMemoryError("CUDA out of memory")],
                         ids=["runtime", "oom"])
def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(model, monkeypatch, error):
    engine = LLMEngine(model, num_pages=12, page_size=16, max_running=2)
    prompts = [prompt_ids(20, seed=i) for i in range(3)]
    ids = [engine.add_request(p, max_new_tokens=8, stop_ids=[]) for p in prompts]
    outputs = engine.step() + engine.step()  # two running, one waiting
    real, calls = model.forward_step, []

    def failing(*args, **kwargs):
        calls.append(1)
        raise error

    monkeypatch.setattr(model, "forward_step", failing)
    outputs += engine.step()
    monkeypatch.setattr(model, "forward_step", real)
    assert len(calls) == 1
    stats = engine.check_accounting()
    assert (stats["running"], stats["waiting"], stats["pages_used"]) == (0, 1, 0)
    for rid in ids[:2]:
        last = finish_of(outputs, rid)
        assert last.finish_reason == "error" and type(error).__name__ in last.error
        assert "the step failed" in last.error
    # The waiting request and new ones are served as if nothing had happened.
    again = engine.add_request(prompts[0], max_new_tokens=8, stop_ids=[])
    outputs += drain(engine)
    expected = generate(model, prompts[0], 8, stop_ids=[])
    assert tokens_of(outputs, again) == expected
    assert tokens_of(outputs, ids[2]) == generate(model, prompts[2], 8, stop_ids=[])
    assert engine.stats()["pages_used"] == 0


def test_a_failing_sampler_fails_the_step_too(model, monkeypatch):
    engine = LLMEngine(model, num_pages=12)
    rid = engine.add_request(prompt_ids(20), max_new_tokens=8, stop_ids=[])

    def broken(*args):
        raise RuntimeError("sampler fault")

    # Whichever sampling op the step calls (greedy rows: the one that also adds up the rows).
    monkeypatch.setattr(model.ops, "sample_tokens", broken)
    monkeypatch.setattr(model.ops, "sample_tokens_with_sums", broken)
    outputs = engine.step()
    assert finish_of(outputs, rid).error.endswith("RuntimeError: sampler fault")
    assert engine.check_accounting()["pages_used"] == 0


def test_interrupting_a_step_leaves_the_requests_running(model, monkeypatch):
    engine = LLMEngine(model, num_pages=12)
    prompt = prompt_ids(20)
    rid = engine.add_request(prompt, max_new_tokens=6, stop_ids=[])
    outputs = engine.step()
    real = model.forward_step

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(model, "forward_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.step()
    monkeypatch.setattr(model, "forward_step", real)
    engine.check_accounting()
    outputs += drain(engine)
    assert tokens_of(outputs, rid) == generate(model, prompt, 6, stop_ids=[])


def test_accounting_after_every_kind_of_ending_together(model, monkeypatch):
    """Finish by length and by stop, abort, preemption and a failed step in one run, the pool
    checked after every step; at the end only cached prefix pages remain."""
    prompts = [prompt_ids(n, seed=n) for n in (30, 22, 41, 9, 35)]
    # the references first: a generate beside the open engine would grow its pool
    alone = [generate(model, p, n, stop_ids=[]) for p, n in zip(prompts, (40, 20, 30, 50, 30))]
    free = alone[1]
    engine = LLMEngine(model, num_pages=7, page_size=16, max_step_tokens=48)
    ids = [engine.add_request(prompts[0], max_new_tokens=40, stop_ids=[]),
           engine.add_request(prompts[1], max_new_tokens=20, stop_ids=[free[6]]),
           engine.add_request(prompts[2], max_new_tokens=30, stop_ids=[]),
           engine.add_request(prompts[3], max_new_tokens=50, stop_ids=[]),
           engine.add_request(prompts[4], max_new_tokens=30, stop_ids=[])]
    outputs, step = [], 0
    real = model.forward_step
    while engine.has_unfinished():
        step += 1
        if step == 5:
            engine.abort(ids[3])
        if step == 30:
            monkeypatch.setattr(model, "forward_step", lambda *a, **k: 1 / 0)
        outputs += engine.step()
        monkeypatch.setattr(model, "forward_step", real)
        engine.check_accounting()
    reasons = {rid: finish_of(outputs, rid).finish_reason for rid in ids}
    assert reasons[ids[1]] == "stop" and reasons[ids[3]] == "abort"
    assert "error" in reasons.values() and engine.stats()["preemptions"] >= 1
    assert tokens_of(outputs, ids[1]) == free[:free.index(free[6])]
    for rid, expected in zip(ids, alone):
        if reasons[rid] == "length":
            assert tokens_of(outputs, rid) == expected
    stats = engine.check_accounting()
    assert stats["pages_used"] == 0 and stats["pages_cached"] + stats["pages_free"] == 7


def test_engine_thread_serves_requests_from_other_threads(model):
    engine = LLMEngine(model, num_pages=30)
    outputs, lock, tick = [], threading.Lock(), threading.Event()

    def on_output(out):
        with lock:
            outputs.append(out)

    def finished():
        with lock:
            return {o.request_id for o in outputs if o.finished}

    runner = EngineThread(engine, on_output).start()
    sampling = SamplingParams(0.8, top_p=0.9)
    prompts, prompt_of = [prompt_ids(n, seed=n) for n in (4, 19, 11)], {}

    def add(prompt):
        rid = runner.add_request(prompt, sampling, max_new_tokens=12, stop_ids=[],
                                 seed=len(prompt))
        with lock:
            prompt_of[rid] = prompt

    adders = [threading.Thread(target=add, args=(p,)) for p in prompts]
    for t in adders:
        t.start()
    for t in adders:
        t.join()
    endless = runner.add_request([5], max_new_tokens=100, stop_ids=[])
    for _ in range(3000):
        if set(prompt_of) <= finished():
            break
        tick.wait(0.01)
    assert runner.abort(endless)
    for _ in range(1000):
        if not engine.has_unfinished():
            break
        tick.wait(0.01)
    runner.stop(timeout=10)
    assert not runner.loop_errors and not engine.has_unfinished()
    for rid, prompt in prompt_of.items():
        assert tokens_of(outputs, rid) == generate(model, prompt, 12, sampling, stop_ids=[],
                                                   seed=len(prompt))
    assert finish_of(outputs, endless).finish_reason == "abort"
    assert engine.check_accounting()["pages_used"] == 0


def test_kv_pool_pages_on_the_cpu(model):
    assert kv_pool_pages(model, cpu_tokens=100, page_size=16) == 7
    assert kv_pool_pages(model) == 32768 // 16
    with pytest.raises(ValueError, match="fraction"):
        kv_pool_pages(model, fraction=0)
    # No pool yet: the engine's is made for its tokens, and at least one sequence of the
    # model's max_len (a generation on the same model shares it), plus a scratch page.
    model.close()
    one_sequence = -(-model.max_len // 16)
    engine = LLMEngine(model, cpu_tokens=16 * (one_sequence + 2), page_size=16)
    stats = engine.stats()
    assert (stats["pages_total"], stats["pages_free"], stats["page_size"]) == \
        (one_sequence + 2, one_sequence + 2, 16)
    assert stats["pool_bytes"] == engine.cache.nbytes
    engine.close()
    # The model's pool only grows for later users: a smaller one keeps it as it is.
    assert LLMEngine(model, cpu_tokens=16, page_size=16).stats()["pages_total"] == one_sequence + 2
    assert LLMEngine(model, cpu_tokens=16 * 3 * one_sequence,
                     page_size=16).stats()["pages_total"] == 3 * one_sequence


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(page_size=0), ValueError, "num_pages and page_size must be >= 1, got None, 0"),
    (dict(num_pages=0), ValueError, "num_pages and page_size must be >= 1, got 0, 16"),
    (dict(num_pages=-3), ValueError, "num_pages and page_size must be >= 1, got -3, 16"),
    (dict(num_pages=2.5), TypeError, "num_pages must be an integer, got 2.5"),
    (dict(kv_quantize="int8", key_smoothing="x"), TypeError,
     "key_smoothing must hold one .*tileinfer.calibrate_key_smoothing gives; got a str"),
])
def test_bad_pool_arguments_are_refused_before_the_pool_changes(tiny, kwargs, error, message):
    model = load_model(tiny.directory("llama", dtype=torch.float32), dtype=torch.float32,
                       backend="ref", max_len=MAX_LEN)
    expected = generate(model, [5, 6, 7, 8], 6, stop_ids=[], seed=1)
    runtime = runtime_of(model)
    pool, pages, builds = runtime.cache, runtime.cache.num_pages, runtime.pool_builds
    with pytest.raises(error, match=message):
        LLMEngine(model, **kwargs)
    assert (runtime.cache, pool.num_pages, runtime.pool_builds) == (pool, pages, builds)
    engine = LLMEngine(model, num_pages=8)
    rid = engine.add_request([5, 6, 7, 8], max_new_tokens=6, stop_ids=[], seed=1)
    assert tokens_of(drain(engine), rid) == expected
    engine.close()


def test_max_running_and_the_step_budget_are_kept(model, monkeypatch):
    engine = LLMEngine(model, num_pages=40, max_running=3, max_step_tokens=10)
    seen = []
    real = engine.runner.run

    def spy(seqs, token_lists, *args):
        seen.append([len(t) for t in token_lists])
        return real(seqs, token_lists, *args)

    monkeypatch.setattr(engine.runner, "run", spy)
    ids = [engine.add_request(prompt_ids(n, seed=n), max_new_tokens=5, stop_ids=[])
           for n in (7, 25, 3, 12, 9)]
    outputs = drain(engine)
    assert max(len(s) for s in seen) == 3 and max(sum(s) for s in seen) == 10
    assert any(len(set(s)) > 1 and 1 in s for s in seen)  # decode rows mixed with a chunk
    # First come, first served: requests finish in the order they arrived (same lengths).
    finished = [o.request_id for o in outputs if o.finished]
    assert finished.index(ids[0]) < finished.index(ids[3]) < finished.index(ids[4])
    assert dataclasses.asdict(outputs[0])["request_id"] in ids
