"""ChatSession on the real SmolLM2-135M-Instruct (ref backend, float32 on the CPU): prefix reuse,
and failed turns (interrupt, out of pages, prompt too long) that leave the conversation and the
cache exactly as they were."""

from __future__ import annotations

import pytest
import torch

from tileinfer import ChatSession, OutOfPagesError, PromptTooLongError, load_model, load_tokenizer

N = 6  # reply tokens per turn: enough to see a turn, cheap on the CPU


@pytest.fixture(scope="module")
def smol(smollm2_dir):
    model = load_model(smollm2_dir, dtype=torch.float32, backend="ref", max_len=512)
    return model, load_tokenizer(smollm2_dir)


def session(smol, **kw):
    model, tok = smol
    return ChatSession(model, tok, **kw)


def snapshot(chat):
    return ([(m.role, m.content) for m in chat.messages], list(chat.seq.tokens),
            list(chat.seq.pages), chat.cache.free_pages)


def test_second_turn_reuses_the_first_turns_cache(smol):
    chat = session(smol)
    reply1, stats1 = chat.reply("What is the capital of France?", N)
    assert "Paris" in reply1
    assert stats1.reused == 0 and stats1.prefilled > 0 and stats1.generated == N
    cached = len(chat.seq)
    _, stats2 = chat.reply("And of Italy?", N)
    # Everything cached from turn one is a prefix of turn two's prompt.
    assert stats2.reused == cached
    assert [m.role for m in chat.messages] == ["user", "assistant", "user", "assistant"]


def test_reply_after_reuse_equals_a_fresh_session(smol):
    chat = session(smol)
    chat.reply("What is the capital of France?", N)
    reused_reply, _ = chat.reply("And of Italy?", N)
    fresh = session(smol)
    fresh.messages = list(chat.messages[:3])  # the same history, nothing cached
    fresh.messages.pop()  # reply() adds the user message itself
    fresh_reply, stats = fresh.reply("And of Italy?", N)
    assert stats.reused == 0 and fresh_reply == reused_reply


def test_interrupted_turn_leaves_conversation_and_cache_as_before(smol):
    chat = session(smol)
    chat.reply("What is the capital of France?", N)
    before = snapshot(chat)

    def interrupt(token, seen=[]):
        seen.append(token)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        chat.reply("Tell me a long story about Rome.", 40, on_token=interrupt)
    assert snapshot(chat) == before
    # The cache content is intact too: the next turn equals an uninterrupted session's.
    after_interrupt, _ = chat.reply("And of Italy?", N)
    clean = session(smol)
    clean.reply("What is the capital of France?", N)
    assert clean.reply("And of Italy?", N)[0] == after_interrupt


def test_out_of_pages_leaves_the_session_usable(smol):
    model, tok = smol
    chat = ChatSession(model, tok, max_tokens=64, page_size=16)
    first, _ = chat.reply("Hi", 4)
    before = snapshot(chat)
    # Another user of the model's shared pool takes every free page, so the next turn cannot
    # get its pages.
    hog = chat.cache.allocator.allocate(chat.cache.free_pages)
    with pytest.raises(OutOfPagesError):
        chat.reply("Tell me more about yourself.", 8)
    chat.cache.allocator.release(hog)
    assert snapshot(chat) == before
    chat.reset()
    assert chat.messages == [] and len(chat.seq) == 0


def test_prompt_too_long_is_a_clear_error_and_changes_nothing(smol):
    model, tok = smol
    chat = ChatSession(model, tok, max_tokens=48)
    chat.reply("Hi", 2)
    before = snapshot(chat)
    with pytest.raises(PromptTooLongError, match="holds 48"):
        chat.reply("word " * 60, 4)
    assert snapshot(chat) == before


def test_sampled_chat_is_reproducible_with_a_seed(smol):
    from tileinfer import SamplingParams

    params = SamplingParams(temperature=0.8, top_p=0.95)
    a = session(smol, sampling=params, seed=123).reply("Name a colour.", N)[0]
    b = session(smol, sampling=params, seed=123).reply("Name a colour.", N)[0]
    assert a == b


def test_second_thread_gets_a_clear_error_and_the_turn_in_progress_is_intact(smol):
    # Before: two threads interleaved both turns into a corrupted conversation and cache.
    import threading

    from tileinfer.engine.generation.chat import ChatSessionBusyError

    chat = session(smol)
    inside, release = threading.Event(), threading.Event()
    results, errors = [], []

    def slow_token(token, seen=[]):
        seen.append(token)
        if len(seen) == 1:
            inside.set()
            assert release.wait(60)

    def first_turn():
        try:
            results.append(chat.reply("What is the capital of France?", N, on_token=slow_token))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    worker = threading.Thread(target=first_turn)
    worker.start()
    assert inside.wait(120)
    before = (list(chat.messages), list(chat.seq.tokens))
    with pytest.raises(ChatSessionBusyError, match="serving a turn in another thread"):
        chat.reply("And of Italy?", N)
    with pytest.raises(ChatSessionBusyError):
        chat.reset()
    assert (list(chat.messages), list(chat.seq.tokens)) == before  # nothing changed
    release.set()
    worker.join(120)
    assert not errors and len(results) == 1
    assert [m.role for m in chat.messages] == ["user", "assistant"]
    # The session is free again, and its state equals a session used from one thread.
    second, _ = chat.reply("And of Italy?", N)
    clean = session(smol)
    clean.reply("What is the capital of France?", N)
    assert clean.reply("And of Italy?", N)[0] == second


def test_system_message_comes_first_and_survives_reset(smol):
    chat = session(smol, system="You are terse.")
    chat.reply("Hi", 2)
    assert [m.role for m in chat.messages] == ["system", "user", "assistant"]
    chat.reset()
    assert [(m.role, m.content) for m in chat.messages] == [("system", "You are terse.")]


def test_cache_larger_than_memory_is_refused_before_allocating(smol, monkeypatch):
    from tileinfer.model import loader
    from tileinfer.model.loader import MemoryLimitError

    model, tok = smol
    model.close()  # the model's KV pool is made anew for the session, and checked first
    monkeypatch.setattr(loader, "available_memory", lambda device: 1 << 20)
    with pytest.raises(MemoryLimitError, match="a KV pool of 528 tokens needs about"):
        ChatSession(model, tok)
    # A session that needs more free pages than the pool has grows it: checked the same way.
    monkeypatch.undo()
    first = ChatSession(model, tok, max_tokens=64)
    first.reply("Hi", 1)  # holds pages of the pool now
    pages = first.cache.num_pages
    monkeypatch.setattr(loader, "available_memory", lambda device: 1 << 10)
    with pytest.raises(MemoryLimitError, match="more tokens needs about"):
        ChatSession(model, tok, max_tokens=512)
    assert first.cache.num_pages == pages
