"""The model runtime: one KV pool, one set of static steps and one sampling stream per loaded
model, made by the first call and shared by every later generate, ChatSession and LLMEngine;
the pool grows keeping live sequences, is made anew only when idle, and goes with
``model.close()``. On the CPU (no graphs) the static steps still run, eagerly."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from tileinfer import (ChatSession, LLMEngine, NgramProposer, PoolBusyError, generate,
                       generate_into, load_model, memory_report, runtime_of)
from tileinfer.engine.generation.runner import ModelRunner
from tileinfer.engine.kv.cache import new_cache
from tiny_models import WordTokenizer, prompt_ids, single_torch_thread, tiny  # noqa: F401

MAX_LEN = 96


@pytest.fixture
def model(tiny):
    return load_model(tiny.directory("llama"), dtype=torch.float32, max_len=MAX_LEN)


def alone(model, prompt, n, **kwargs):
    """The tokens of a runner and cache of their own (nothing shared with the runtime)."""
    runner = ModelRunner(model, new_cache(model))
    seq = runner.cache.new_sequence()
    return generate_into(runner, seq, prompt, n, stop_ids=[], seed=3, **kwargs)


def test_generate_makes_the_runtime_once_and_reuses_it(model):
    prompt = prompt_ids(11, seed=1)
    first = generate(model, prompt, 12, stop_ids=[], seed=3)
    runtime = runtime_of(model)
    steps = [id(step) for step in runtime.steps.steps()]
    pool = runtime.cache
    assert runtime.pool_builds == 1 and steps
    for _ in range(2):
        assert generate(model, prompt, 12, stop_ids=[], seed=3) == first
    assert runtime_of(model) is runtime and runtime.cache is pool and runtime.pool_builds == 1
    assert [id(step) for step in runtime.steps.steps()] == steps  # no step made again
    assert runtime.live_pages() == 0  # each call gave its pages back
    assert first == alone(model, prompt, 12)
    # Speculation keeps its cost model in the runtime across calls.
    spec = generate(model, prompt, 12, stop_ids=[], seed=3, speculative=NgramProposer())
    assert spec == first and runtime.step_seconds


def test_a_chat_session_and_an_engine_share_one_pool(model, tiny):
    tok = WordTokenizer()
    chat = ChatSession(model, tok, template="{% for m in messages %}{{ m.content }}{% endfor %}")
    chat.reply("hello there", 4)
    engine = LLMEngine(model, cpu_tokens=4 * MAX_LEN)
    assert engine.cache is chat.cache is runtime_of(model).cache
    held = len(chat.seq.pages)
    assert held > 0 and engine.stats()["pages_free"] == engine.num_pages - held
    rid = engine.add_request(prompt_ids(9, seed=2), max_new_tokens=5, stop_ids=[], seed=4)
    out = []
    while engine.has_unfinished():
        out += [t for o in engine.step() if o.request_id == rid for t in o.new_tokens]
    assert out == alone(model, prompt_ids(9, seed=2), 5)  # the same as with a pool of its own
    engine.close()
    assert len(chat.seq.pages) == held  # the conversation kept its pages through all of it


def test_growing_the_pool_keeps_a_live_conversation(model, tiny):
    tok = WordTokenizer()
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    chat = ChatSession(model, tok, template=template, seed=0)
    chat.reply("one two three", 5)
    pages = runtime_of(model).cache.num_pages
    LLMEngine(model, cpu_tokens=8 * MAX_LEN).close()  # grows the pool under the conversation
    assert runtime_of(model).cache.num_pages > pages
    second, _ = chat.reply("four five", 5)
    clean = ChatSession(load_model(tiny.directory("llama"), dtype=torch.float32,
                                   max_len=MAX_LEN), tok, template=template, seed=0)
    clean.reply("one two three", 5)
    assert clean.reply("four five", 5)[0] == second


def test_another_precision_needs_an_idle_pool(model, tiny):
    tok = WordTokenizer()
    chat = ChatSession(model, tok, template="{{ messages[-1].content }}")
    chat.reply("hi", 2)
    before = runtime_of(model).cache
    with pytest.raises(PoolBusyError, match="close them"):
        generate(model, prompt_ids(5), 3, kv_quantize="int8")
    assert runtime_of(model).cache is before and chat.reply("again", 2)
    chat.close()
    out = generate(model, prompt_ids(5), 3, kv_quantize="int8", stop_ids=[])
    assert len(out) == 3 and runtime_of(model).cache.quantize == "int8"


def test_a_dropped_session_gives_its_pages_back(model, tiny):
    tok = WordTokenizer()
    chat = ChatSession(model, tok, template="{{ messages[-1].content }}")
    chat.reply("some words here", 3)
    assert runtime_of(model).live_pages() > 0
    del chat
    gc.collect()
    assert runtime_of(model).live_pages() == 0


def test_memory_is_reported_and_given_back_on_close(model):
    assert memory_report(model)["runtime"]["kv_pool_bytes"] == 0  # nothing ran yet
    generate(model, prompt_ids(20), 4)
    report = memory_report(model)["runtime"]
    runtime = runtime_of(model)
    assert report["kv_pool_bytes"] == runtime.cache.nbytes > 0
    assert report["static_step_bytes"] == runtime.steps.nbytes > 0
    assert report["kv_pool_pages"] == runtime.cache.num_pages
    model.close()
    assert memory_report(model)["runtime"]["kv_pool_bytes"] == 0
    assert generate(model, prompt_ids(20), 4, stop_ids=[])  # usable again: a new runtime


def test_generations_from_two_threads_take_turns(model, single_torch_thread):  # noqa: F811
    prompts = [prompt_ids(7 + i, seed=i) for i in range(4)]
    expected = [generate(model, p, 10, stop_ids=[], seed=5) for p in prompts]
    results = [None] * len(prompts)

    def work(i):
        results[i] = generate(model, prompts[i], 10, stop_ids=[], seed=5)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == expected
