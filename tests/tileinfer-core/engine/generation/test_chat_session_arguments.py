"""ChatSession's argument checks on a tiny random model: a bad max_tokens, seed, stop id,
proposer or pool argument is refused when the session is made, and a reply to something that is
not text before the template runs, each leaving the model's pool and the conversation as they
were."""

from __future__ import annotations

import pytest
import torch

from tileinfer import ChatSession, SamplingParams, load_model, runtime_of
from tiny_models import WordTokenizer, single_torch_thread, tiny  # noqa: F401

MAX_LEN = 96
TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"


@pytest.fixture
def model(tiny):  # noqa: F811
    return load_model(tiny.directory("llama"), dtype=torch.float32, max_len=MAX_LEN)


def session(model, **kwargs):
    kwargs = dict(dict(template=TEMPLATE, sampling=SamplingParams(0.8), seed=3, stop_ids=[]),
                  **kwargs)
    return ChatSession(model, WordTokenizer(), **kwargs)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(max_tokens=-5), ValueError, "max_tokens must be None or an integer >= 1, got -5"),
    (dict(max_tokens=0), ValueError, "max_tokens must be None or an integer >= 1, got 0"),
    (dict(max_tokens=40.0), ValueError, "max_tokens must be None or an integer >= 1, got 40.0"),
    (dict(max_tokens=True), ValueError, "max_tokens must be None or an integer >= 1, got True"),
    (dict(seed=2 ** 64), ValueError, "seed must be an integer in the int64 range"),
    (dict(seed=1.5), ValueError, "seed must be an integer in the int64 range, got 1.5"),
    (dict(stop_ids=["24"]), TypeError, "stop_ids must be a sequence .*got '24' at index 0"),
    (dict(stop_ids=[10 ** 6]), ValueError, "stop_ids: token id 1000000 is outside the vocab"),
    (dict(stop_ids=[-1]), ValueError, "stop_ids: token id -1 is outside the vocabulary"),
    (dict(speculative="ngram"), TypeError, "speculative takes a proposer object"),
    (dict(page_size=0), ValueError, "num_pages and page_size must be >= 1, got None, 0"),
    (dict(kv_cache="int8", key_smoothing="x"), TypeError,
     "key_smoothing must hold one .*tileinfer.calibrate_key_smoothing gives; got a str"),
])
def test_bad_arguments_are_refused_when_the_session_is_made(model, kwargs, error, message):
    chat = session(model)
    chat.reply("one two three", 5)
    runtime = runtime_of(model)
    pool, pages, live = runtime.cache, runtime.cache.num_pages, runtime.live_pages()
    with pytest.raises(error, match=message):
        session(model, **kwargs)
    assert (runtime.cache, pool.num_pages, runtime.live_pages()) == (pool, pages, live)
    second, _ = chat.reply("four five", 5)
    clean = session(model)
    clean.reply("one two three", 5)
    assert clean.reply("four five", 5)[0] == second


def test_max_tokens_none_is_the_models_max_len(model):
    assert session(model).max_tokens == session(model, max_tokens=None).max_tokens == MAX_LEN
    assert session(model, max_tokens=1).max_tokens == 1


@pytest.mark.parametrize("text", [None, 5, ["hello"]])
def test_reply_to_what_is_not_text_is_refused_before_the_template(model, text):
    chat = session(model)
    first, _ = chat.reply("one two three", 5)
    before = ([(m.role, m.content) for m in chat.messages], list(chat.seq.tokens), chat.turns)
    with pytest.raises(TypeError, match=f"text must be a str, got {type(text).__name__}"):
        chat.reply(text, 5)
    assert ([(m.role, m.content) for m in chat.messages], chat.seq.tokens, chat.turns) == before
    second, _ = chat.reply("four five", 5)
    clean = session(model)
    assert clean.reply("one two three", 5)[0] == first
    assert clean.reply("four five", 5)[0] == second


def test_the_largest_seed_wraps_into_the_int64_range_turn_by_turn(model):
    """Turn t samples with the session's seed + t; past 2**63 - 1 that wraps to -2**63, which
    generate takes as it takes any int64 seed (the turn's tokens are generate's with it)."""
    from tileinfer import generate_into

    chat = session(model, seed=2**63 - 1)
    assert chat.turn_seed() == 2**63 - 1
    chat.reply("one two", 4)
    assert chat.turn_seed() == -2**63
    reply, _ = chat.reply("three", 4)
    ids = chat.prompt_ids(chat.messages[:-1])
    runner = chat.runner
    seq = runner.cache.new_sequence()
    try:
        tokens = generate_into(runner, seq, ids, 4, SamplingParams(0.8), [], -2**63)
    finally:
        runner.cache.release(seq)
    assert reply == WordTokenizer().decode(tokens)
