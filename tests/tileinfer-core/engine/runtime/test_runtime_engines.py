"""The model runtime's pool under an open LLMEngine: an engine keeps the pool it was made with,
so other users grow that pool in place while the engine is open; when the pool is made anew
under an idle engine (another page size, ``model.close()``) the engine says so instead of
stepping on a pool that is gone."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from tileinfer import ChatSession, LLMEngine, generate, load_model, runtime_of
from tiny_models import WordTokenizer, prompt_ids, tiny  # noqa: F401

MAX_LEN = 96  # a ChatSession or generate asks for MAX_LEN / 16 + 1 = 7 pages
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


def fresh(tiny):  # noqa: F811
    return load_model(tiny.directory("llama"), dtype=torch.float32, max_len=MAX_LEN)


def finish(engine, rid) -> list[int]:
    out = []
    while engine.has_unfinished():
        out += [t for o in engine.step() if o.request_id == rid for t in o.new_tokens]
    return out


def test_a_session_made_beside_a_small_idle_engine_grows_the_engines_pool(tiny):  # noqa: F811
    model = fresh(tiny)
    prompt = prompt_ids(9, seed=2)
    expected = generate(fresh(tiny), prompt, 5, stop_ids=[], seed=4)
    engine = LLMEngine(model, num_pages=3)  # 4 pages with the scratch page: fewer than 7
    pool = engine.cache
    chat = ChatSession(model, WordTokenizer(), template=TEMPLATE, seed=0)
    assert runtime_of(model).cache is pool and pool.num_pages >= 7  # grown, not made anew
    rid = engine.add_request(prompt, max_new_tokens=5, stop_ids=[], seed=4)
    first, _ = chat.reply("one two three", 5)
    assert finish(engine, rid) == expected
    second, _ = chat.reply("four five", 5)
    clean = ChatSession(fresh(tiny), WordTokenizer(), template=TEMPLATE, seed=0)
    assert clean.reply("one two three", 5)[0] == first
    assert clean.reply("four five", 5)[0] == second
    engine.close()


def test_another_page_size_leaves_an_idle_engine_refusing_in_words(tiny):  # noqa: F811
    model = fresh(tiny)
    engine = LLMEngine(model, num_pages=8)
    rid = engine.add_request(prompt_ids(5), max_new_tokens=3, stop_ids=[])
    assert len(finish(engine, rid)) == 3
    queued = engine.add_request(prompt_ids(5), max_new_tokens=3, stop_ids=[])  # holds no pages
    assert len(generate(model, prompt_ids(5), 3, page_size=8, stop_ids=[])) == 3
    assert runtime_of(model).cache.page_size == 8 and engine.cache.page_size == 16
    assert engine.cache.nbytes == 0  # the old pool's memory went back before the new one was made
    outs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [(queued, "error")]
    assert "KV pool is gone" in outs[0].error
    with pytest.raises(RuntimeError, match="KV pool is gone.*make a new one"):
        engine.add_request(prompt_ids(5), max_new_tokens=3, stop_ids=[])
    engine.close()
    engine = LLMEngine(model, num_pages=8, page_size=8)
    rid = engine.add_request(prompt_ids(5), max_new_tokens=3, stop_ids=[])
    assert len(finish(engine, rid)) == 3


def test_an_engine_dropped_without_close_holds_the_pool_no_longer(tiny):  # noqa: F811
    """Dropped, the small engine no longer needs its pool kept: a generation that needs more
    pages gets a pool made anew (the old one freed first) instead of the old one grown."""
    model = fresh(tiny)
    engine = LLMEngine(model, num_pages=3)
    engine.add_request(prompt_ids(5), max_new_tokens=3, stop_ids=[])
    engine.step()
    small = engine.cache
    del engine
    gc.collect()
    assert runtime_of(model).open_engines() == 0
    assert len(generate(model, prompt_ids(5), 3, stop_ids=[])) == 3
    assert runtime_of(model).cache is not small and small.num_pages == 4


def test_after_model_close_an_engine_fails_in_words_and_holds_no_pool(tiny):  # noqa: F811
    """model.close() frees the pool's tensors while the engine is still open (the engine keeps
    only the emptied pool object), and the engine then fails in words."""
    model = fresh(tiny)
    engine = LLMEngine(model, cpu_tokens=4 * MAX_LEN)
    rid = engine.add_request(prompt_ids(7), max_new_tokens=4, stop_ids=[])
    pages = weakref.ref(engine.cache.k_pages)
    assert engine.cache.nbytes > 0
    model.close()
    gc.collect()
    assert pages() is None and engine.cache.nbytes == 0
    outs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [(rid, "error")]
    assert "the model was closed" in outs[0].error and not engine.has_unfinished()
    with pytest.raises(RuntimeError, match="the model was closed"):
        engine.add_request(prompt_ids(7), max_new_tokens=4, stop_ids=[])
    engine.close()
    assert len(generate(model, prompt_ids(7), 4, stop_ids=[])) == 4  # the model itself works


def test_a_chat_session_goes_on_after_model_close(tiny):  # noqa: F811
    """model.close() lets the session's pages go; its next turn computes the conversation
    again in the new runtime's pool and answers as a session that was never interrupted."""
    model = fresh(tiny)
    chat = ChatSession(model, WordTokenizer(), template=TEMPLATE, seed=0)
    first, _ = chat.reply("one two three", 5)
    model.close()
    second, stats = chat.reply("four five", 5)
    assert stats.reused == 0 and chat.cache is runtime_of(model).cache
    third, stats = chat.reply("six", 5)
    assert stats.reused > 0  # cached again from then on
    clean = ChatSession(fresh(tiny), WordTokenizer(), template=TEMPLATE, seed=0)
    assert [clean.reply(text, 5)[0] for text in ("one two three", "four five", "six")] == \
        [first, second, third]
    chat.close()
    assert runtime_of(model).live_pages() == 0
