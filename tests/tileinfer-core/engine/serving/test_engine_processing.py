"""Logit bias, penalties and min_p in the serving engine: every request's tokens equal
``tileinfer.generate`` of it alone (itself checked against the host definition), when requests
with and without them share steps, through chunked prefill, preemption, the padded static decode
steps and pipelining (on the CPU they run eagerly: the same code paths); token counts out of step
with the output are rebuilt; a bias outside the vocabulary is refused."""

from __future__ import annotations

import pytest
import torch

from tileinfer import LLMEngine, RequestError, SamplingParams, generate, load_model
from tileinfer.backend.logit_processing import token_state
from tileinfer.engine.serving.batch_processing import TokenCounts, hold_stops, process_rows
from tileinfer.engine.serving.request import Request
from tiny_models import prompt_ids, single_torch_thread, tiny  # noqa: F401

MAX_LEN = 128
MIXED = [
    SamplingParams(0.0),
    SamplingParams(0.0, repetition_penalty=1.8),
    SamplingParams(1.0, top_k=40),
    SamplingParams(1.0, top_k=40, frequency_penalty=2.0, presence_penalty=-0.5),
    SamplingParams(0.8, min_p=0.3, logit_bias={3: 5.0, 17: -100}),
    SamplingParams(0.9, top_p=0.9, repetition_penalty=1.3, presence_penalty=0.5,
                   frequency_penalty=0.3, logit_bias={40: 2.0}, min_p=0.05),
]


def load(tiny):
    return load_model(tiny.directory("llama", dtype=torch.float32), dtype=torch.float32,
                      backend="ref", max_len=MAX_LEN)


def requests(lengths=(3, 20, 9, 33, 5, 17), news=(20, 14, 25, 12, 22, 18)):
    return [dict(prompt_ids=prompt_ids(n, seed=60 + i), max_new_tokens=m, stop_ids=[],
                 seed=30 + i, sampling=MIXED[i % len(MIXED)])
            for i, (n, m) in enumerate(zip(lengths, news))]


def run(engine, reqs):
    ids = [engine.add_request(**r) for r in reqs]
    tokens = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_tokens)
        engine.check_accounting()
    return [tokens[rid] for rid in ids]


def alone(model, r):
    return generate(model, r["prompt_ids"], r["max_new_tokens"], r["sampling"], stop_ids=[],
                    seed=r["seed"])


@pytest.mark.parametrize("kw", [
    dict(num_pages=40, max_step_tokens=24, static_decode=False, pipeline=False),
    dict(num_pages=40, max_running=8, static_decode=True, pipeline=True),
    dict(num_pages=6, max_step_tokens=40),  # preemption, again and again
], ids=["chunked", "static-pipelined", "preempted"])
def test_each_request_equals_generate_alone(tiny, kw):
    model = load(tiny)
    reqs = requests() if kw["num_pages"] > 6 else requests(news=(30, 40, 30, 25, 35, 30))
    engine = LLMEngine(model, **kw)
    assert run(engine, reqs) == [alone(model, r) for r in reqs]
    stats = engine.stats()
    if kw["num_pages"] == 6:
        assert stats["preemptions"] >= 3
    if kw.get("pipeline"):
        assert stats["pipelined_steps"] > 0


def test_processed_rows_leave_the_others_bit_for_bit(tiny):
    logits = torch.randn(4, 512, generator=torch.Generator().manual_seed(0))
    reqs = [Request(j, prompt_ids(5, seed=j), p, 10, frozenset(), j, j)
            for j, p in enumerate([MIXED[0], MIXED[3], MIXED[2], MIXED[4]])]
    out = process_rows(logits, reqs, [0] * 4)
    assert out is not logits and torch.equal(out[[0, 2]], logits[[0, 2]])
    assert not torch.equal(out[[1, 3]], logits[[1, 3]])
    assert process_rows(logits, [reqs[0]] * 4, [0] * 4) is logits


def test_token_counts_out_of_step_are_rebuilt_from_the_host():
    req = Request(0, [1, 2, 3], MIXED[3], 10, frozenset(), 0, 0, output=[7, 7, 9])
    state = req.token_counts = TokenCounts(16, "cpu")
    state.sync(req, 2)  # the first two output tokens
    counts, seen = token_state([1, 2, 3], [7, 7], 16)
    assert torch.equal(state.counts, counts) and torch.equal(state.seen, seen)
    state.counted = 3  # as if a token sampled in a failed step had been counted
    state.sync(req, 2)
    assert torch.equal(state.counts, counts) and state.counted == 2
    with pytest.raises(RuntimeError, match="token counts"):
        state.sync(req, 5)


def test_a_bias_outside_the_vocabulary_is_refused(tiny):
    engine = LLMEngine(load(tiny), num_pages=8)
    with pytest.raises(RequestError, match="outside the vocabulary"):
        engine.add_request([1, 2], SamplingParams(logit_bias={512: 1.0}))


def test_stop_ids_are_held_back_in_the_rows_before_min_new_tokens():
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    reqs = [Request(j, [1, 2], SamplingParams(), 10, frozenset({5, 9}), j, j, min_new_tokens=m)
            for j, m in enumerate([3, 0, 4])]
    out = hold_stops(logits, reqs, [2, 0, 4])  # only row 0 is before its min_new_tokens
    assert out is not logits and torch.equal(out[1:], logits[1:])
    assert out[0, 5] == out[0, 9] == float("-inf")
    keep = [i for i in range(64) if i not in (5, 9)]
    assert torch.equal(out[0, keep], logits[0, keep])
    assert hold_stops(logits, reqs, [3, 0, 4]) is logits


def test_min_new_tokens_holds_the_stop_ids_back_then_lets_them_end_it(tiny):
    """Greedy: a request whose first token would be a stop id writes min_new_tokens tokens
    first (each the best token but the stop ids: generate with those ids biased by -100), then
    goes on as generate of its prompt and those tokens, stopping at them; beside others."""
    model = load(tiny)
    prompt = prompt_ids(11, seed=5)
    first = generate(model, prompt, 1, SamplingParams(0.0), stop_ids=[])[0]
    stops = [first, 2]
    engine = LLMEngine(model, num_pages=40, max_step_tokens=24)
    others = requests()[:3]
    held = dict(prompt_ids=prompt, max_new_tokens=30, stop_ids=stops, seed=0,
                sampling=SamplingParams(0.0), min_new_tokens=6)
    got = run(engine, others + [held, dict(held, min_new_tokens=0)])
    assert got[:3] == [alone(model, r) for r in others]
    assert got[4] == []  # without it, the first token is a stop id
    head = generate(model, prompt, 6, SamplingParams(0.0, logit_bias={i: -100 for i in stops}),
                    stop_ids=[])
    tail = generate(model, prompt + head, 24, SamplingParams(0.0), stop_ids=stops)
    assert got[3] == head + tail and len(got[3]) >= 6 and not set(head) & set(stops)


def test_min_new_tokens_is_checked(tiny):
    engine = LLMEngine(load(tiny), num_pages=40)
    with pytest.raises(RequestError, match="min_new_tokens"):
        engine.add_request([1, 2, 3], max_new_tokens=4, min_new_tokens=5)
    with pytest.raises(RequestError, match="min_new_tokens"):
        engine.add_request([1, 2, 3], max_new_tokens=4, min_new_tokens=-1)
