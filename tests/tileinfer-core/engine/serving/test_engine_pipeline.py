"""The engine's pipelining (a decode step launched from the previous step's sampled ids before
they are read back): every request's tokens and finish reason equal those of the engine without
it, and of each request alone, through stops, lengths, sampling with seeds, aborts and arrivals
while a step is in flight, and a launch that fails; the pool's accounting holds after every step.
On the CPU the static decode steps (``static_decode=True``, what CUDA graphs replay) run eagerly,
so the same code paths run, without the overlap."""

from __future__ import annotations

import torch

from tileinfer import LLMEngine, SamplingParams, generate, load_model
from tiny_models import prompt_ids, single_torch_thread, tiny  # noqa: F401

SAMPLINGS = [SamplingParams(0.0), SamplingParams(1.0, top_k=40), SamplingParams(0.8, top_p=0.9)]


def load(tiny):
    return load_model(tiny.directory("llama", dtype=torch.float32), dtype=torch.float32,
                      backend="ref", max_len=128)


def engine_of(model, pipeline=True, **kw):
    kw = dict(num_pages=48, max_running=8, static_decode=True, pipeline=pipeline) | kw
    return LLMEngine(model, **kw)


def requests(stop_ids=()):
    lengths, news = (3, 9, 17, 5, 12, 30), (14, 22, 9, 18, 25, 11)
    return [dict(prompt_ids=prompt_ids(n, seed=40 + i), max_new_tokens=m,
                 stop_ids=list(stop_ids), seed=7 + i, sampling=SAMPLINGS[i % 3])
            for i, (n, m) in enumerate(zip(lengths, news))]


def run(engine, reqs, on_step=None):
    ids = [engine.add_request(**r) for r in reqs]
    tokens, reasons, step = {rid: [] for rid in ids}, {}, 0
    while engine.has_unfinished():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_tokens)
            if out.finished:
                reasons[out.request_id] = out.finish_reason
        engine.check_accounting()
        step += 1
        if on_step is not None:
            on_step(engine, step, ids)
    stats = engine.check_accounting()
    assert stats["running"] == stats["waiting"] == 0
    assert stats["pages_used"] == 0
    return ids, tokens, reasons


def test_pipelined_steps_give_the_tokens_of_unpipelined_ones(tiny):
    model = load(tiny)
    reqs = requests()
    _, plain, _ = run(engine_of(model, pipeline=False), reqs)
    # Stop ids taken from the middle of two outputs: requests stop while a step is in flight.
    stops = [plain[0][5], plain[3][9]]
    reqs = requests(stops)
    ids0, expected, reasons0 = run(engine_of(model, pipeline=False), reqs)
    engine = engine_of(model)
    ids, got, reasons = run(engine, reqs)
    assert [got[i] for i in ids] == [expected[i] for i in ids0]
    assert [reasons[i] for i in ids] == [reasons0[i] for i in ids0]
    assert "stop" in reasons.values() and "length" in reasons.values()
    assert engine.stats()["pipelined_steps"] > 10
    for r, rid in zip(reqs, ids):  # and each request alone
        assert got[rid] == generate(model, r["prompt_ids"], r["max_new_tokens"], r["sampling"],
                                    stop_ids=r["stop_ids"], seed=r["seed"])


def test_abort_and_arrival_while_a_step_is_in_flight(tiny):
    model = load(tiny)
    reqs = requests()
    late = dict(prompt_ids=prompt_ids(6, seed=99), max_new_tokens=10, stop_ids=[], seed=3,
                sampling=SAMPLINGS[1])
    seen = {}

    def on_step(engine, step, ids):
        if step == 8:
            assert engine._inflight is not None  # a step is running: abort from under it
            assert engine.abort(ids[1])
        if step == 10:
            seen["late"] = engine.add_request(**late)

    engine = engine_of(model)
    ids, got, reasons = run(engine, reqs, on_step)
    assert reasons[ids[1]] == "abort"
    assert reasons[seen["late"]] == "length"
    for i, (r, rid) in enumerate(zip(reqs + [late], ids + [seen["late"]])):
        alone = generate(model, r["prompt_ids"], r["max_new_tokens"], r["sampling"],
                         stop_ids=[], seed=r["seed"])
        if i == 1:  # aborted: a prefix of its tokens
            assert alone[:len(got[rid])] == got[rid] and len(got[rid]) < len(alone)
        else:
            assert got[rid] == alone


def test_a_failing_pipelined_launch_falls_back_to_the_scheduler(tiny, monkeypatch):
    model = load(tiny)
    reqs = requests()
    _, expected, _ = run(engine_of(model, pipeline=False), reqs)
    engine = engine_of(model)
    real, calls = engine.runner.run_device_ids, []

    def flaky(seqs, ids):
        calls.append(len(seqs))
        if len(calls) % 3 == 0:
            raise RuntimeError("injected fault")
        return real(seqs, ids)

    monkeypatch.setattr(engine.runner, "run_device_ids", flaky)
    ids, got, reasons = run(engine, reqs)
    assert len(calls) > 6 and set(reasons.values()) == {"length"}
    assert [got[i] for i in ids] == list(expected.values())


def test_logprobs_and_no_pipeline_option(tiny):
    model = load(tiny)
    r = requests()[:2]
    for one in r:
        one["logprobs"] = 2
    engine = engine_of(model)
    ids, got, _ = run(engine, r)
    assert engine.stats()["pipelined_steps"] == 0  # the requests want logprobs: no overlap
    off = engine_of(model, pipeline=False)
    ids2, got2, _ = run(off, r)
    assert [got[i] for i in ids] == [got2[i] for i in ids2]
    assert off.stats()["pipelined_steps"] == 0
