"""EngineProcess: the engine built and stepped in a child process answers as the same engine in
this process does (tokens and log-probabilities, greedy and seeded), refuses bad requests in the
caller's thread, aborts, reports its stats, fails its requests when the child dies and raises a
build's error at start."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tileinfer import (EngineGone, EngineParts, EngineProcess, LLMEngine, RequestError,
                       SamplingParams)
from tileinfer.model.config import config_from_dict
from tileinfer.model.random_weights import random_model
from tiny_models import COMMON, prompt_ids

MAX_LEN = 128
TIMEOUT_S = 120


def tiny_engine(seed: int = 0) -> LLMEngine:
    config = config_from_dict(dict(COMMON, model_type="llama"))
    model = random_model(config, dtype=torch.float32, backend="ref", device="cpu",
                         max_len=MAX_LEN, seed=seed)
    return LLMEngine(model, max_running=4, cpu_tokens=1024)


def build_tiny(seed: int = 0) -> EngineParts:  # runs in the child
    torch.set_num_threads(1)
    return EngineParts(tiny_engine(seed), info={"backend": "ref", "seed": seed})


def build_failing():
    raise ValueError("no weights in this folder")


class Outputs:
    """The outputs handed over by the reader thread, and a wait for a request's last one."""

    def __init__(self):
        self.all, self.done = [], {}
        self.changed = threading.Condition()

    def __call__(self, out):
        with self.changed:
            self.all.append(out)
            if out.finished:
                self.done[out.request_id] = out
            self.changed.notify_all()

    def wait(self, rid):
        with self.changed:
            assert self.changed.wait_for(lambda: rid in self.done, TIMEOUT_S), f"{rid} never ended"
            return self.done[rid]

    def tokens(self, rid):
        return [t for o in self.all if o.request_id == rid for t in o.new_tokens]

    def logprobs(self, rid):
        return [lp for o in self.all if o.request_id == rid for lp in (o.logprobs or [])]


@pytest.fixture(scope="module")
def process():
    outputs = Outputs()
    p = EngineProcess(build_tiny, (0,)).start().start_outputs(outputs)
    p.outputs = outputs
    yield p
    p.stop(timeout=30)
    assert p._process.exitcode == 0


REQUESTS = [dict(prompt_ids=prompt_ids(12, seed=1), max_new_tokens=9),
            dict(prompt_ids=prompt_ids(30, seed=2), max_new_tokens=5, logprobs=2),
            dict(prompt_ids=prompt_ids(7, seed=3), max_new_tokens=12, seed=5, logprobs=1,
                 sampling=SamplingParams(temperature=0.8))]


def test_answers_equal_the_same_engine_in_this_process(process):
    torch.set_num_threads(1)
    here = tiny_engine()
    ids = [here.add_request(**r) for r in REQUESTS]
    outputs = []
    while here.has_unfinished():
        outputs += here.step()
    rids = [process.add_request(**r) for r in REQUESTS]
    assert process.info == {"backend": "ref", "seed": 0}
    for mine, theirs, request in zip(ids, rids, REQUESTS):
        last = process.outputs.wait(theirs)
        assert last.finish_reason == "length"
        expected = [t for o in outputs if o.request_id == mine for t in o.new_tokens]
        assert process.outputs.tokens(theirs) == expected
        assert len(expected) == request["max_new_tokens"]
        lps = [lp for o in outputs if o.request_id == mine for lp in (o.logprobs or [])]
        assert process.outputs.logprobs(theirs) == lps


def test_bad_requests_are_refused_in_the_callers_thread(process):
    sent = process._sent
    with pytest.raises(RequestError, match="outside the vocabulary"):
        process.add_request([1, 10 ** 6])
    with pytest.raises(RequestError, match=f"max_len is {MAX_LEN}"):
        process.add_request(list(range(MAX_LEN + 1)))
    assert process._sent == sent  # nothing went to the child


def test_an_abort_ends_the_request_and_gives_its_pages_back(process):
    rid = process.add_request(prompt_ids(20, seed=4), max_new_tokens=100)
    assert process.abort(rid)
    last = process.outputs.wait(rid)
    assert last.finish_reason == "abort" and len(process.outputs.tokens(rid)) < 100
    deadline = time.monotonic() + TIMEOUT_S
    while process.stats()["pages_used"] and time.monotonic() < deadline:
        time.sleep(0.01)  # the child reports once more after the abort's step
    stats = process.stats()
    assert stats["pages_used"] == 0 and stats["running"] == 0 and stats["waiting"] == 0
    assert not process.abort(rid)  # no longer unfinished


def test_a_dead_engine_process_fails_its_requests_and_refuses_new_ones():
    outputs = Outputs()
    p = EngineProcess(build_tiny, (1,)).start().start_outputs(outputs)
    rid = p.add_request(prompt_ids(10, seed=5), max_new_tokens=MAX_LEN - 10)
    p._process.kill()
    last = outputs.wait(rid)
    assert last.finish_reason == "error" and "engine process ended" in last.error
    with pytest.raises(EngineGone):
        p.add_request(prompt_ids(10, seed=5), max_new_tokens=4)
    p.stop(timeout=10)


def test_a_failing_build_is_raised_at_start_with_its_message():
    with pytest.raises(RuntimeError, match="ValueError: no weights in this folder"):
        EngineProcess(build_failing).start()
