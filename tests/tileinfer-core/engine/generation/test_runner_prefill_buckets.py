"""Prefills padded to a static bucket (ModelRunner, engine/generation/runner.py): the same logits, tokens,
hidden states, sequence and page pool as an unpadded prefill, on the CPU (``static_prefill``
runs on the static slots without graphs: what a graph replays) and with graphs on the GPU."""

from __future__ import annotations

import pytest
import torch

from tileinfer import SamplingParams, load_model
from tileinfer.engine.kv.cache import new_cache
from tileinfer.engine.generation.generate import generate_into
from tileinfer.engine.generation.runner import MAX_PREFILL_BUCKET, ModelRunner, prefill_bucket
from tileinfer.engine.kv.step import prepare_step
from gpu_params import gpu_backends
from tiny_models import prompt_ids, tiny  # noqa: F401

MAX_LEN = 160


def load(tiny, backend="ref", dtype=torch.float32, device=None):
    return load_model(tiny.directory("llama", dtype=dtype), dtype=dtype, backend=backend,
                      max_len=MAX_LEN, device=device)


def test_bucket_is_the_next_power_of_two_from_16_up_to_the_largest():
    assert [prefill_bucket(n) for n in (9, 15, 16, 17, 33, 100, 512)] == [
        16, 16, 16, 32, 64, 128, 512]
    assert prefill_bucket(MAX_PREFILL_BUCKET + 1) is None


@pytest.mark.parametrize("n", [12, 16, 40, 100])
def test_padded_prefill_equals_the_unpadded_one(tiny, n):
    """Logits of the last real row, every layer's hidden states, the greedy continuation, the
    sequence and the pool: a padded prefill (12 -> 16, 40 -> 64, 100 -> 128 tokens) against the
    same prompt run at its true size."""
    model = load(tiny)
    prompt = prompt_ids(n)
    results = {}
    for static in (False, True):
        cache = new_cache(model, MAX_LEN)
        runner = ModelRunner(model, cache, static_prefill=static)
        hidden = {}

        def listener(seq, start, ids, out, hidden=hidden):
            if start == 0:  # the prefill's rows
                hidden.update({layer: rows.clone() for layer, rows in out.items()})

        runner.capture_hidden_states([0, 1], listener)
        seq = cache.new_sequence()
        logits = runner.forward(seq, prompt).clone()
        pages, free = list(seq.pages), cache.free_pages
        out = generate_into(runner, seq, [int(logits.argmax())], 12, stop_ids=[])
        results[static] = dict(logits=logits, hidden=hidden, pages=pages, free=free, out=out,
                               tokens=list(seq.tokens), bucket=runner.static_step(prefill_bucket(n)) is not None)
    plain, padded = results[False], results[True]
    assert padded["bucket"] and not plain["bucket"]  # only the padded run used a prefill slot
    torch.testing.assert_close(padded["logits"], plain["logits"], rtol=1e-5, atol=1e-5)
    assert sorted(padded["hidden"]) == [0, 1]
    for layer in (0, 1):
        assert padded["hidden"][layer].shape == (n, model.config.hidden_size)
        torch.testing.assert_close(padded["hidden"][layer], plain["hidden"][layer],
                                   rtol=1e-5, atol=1e-5)
    # The padding's pages went back: the sequence holds the pages of its real tokens only.
    assert (padded["pages"], padded["free"]) == (plain["pages"], plain["free"])
    assert (padded["out"], padded["tokens"]) == (plain["out"], plain["tokens"])


def test_a_later_turn_is_padded_after_the_cached_positions(tiny):
    """A second prefill (a chat turn) after the first turn's cached tokens: padded 30 -> 32; both
    turns' greedy answers, the sequence and the pool equal the same two turns run unpadded."""
    model = load(tiny)
    first, second = prompt_ids(20, seed=1), prompt_ids(30, seed=2)
    outs = []
    for static in (False, True):
        cache = new_cache(model, MAX_LEN)
        runner = ModelRunner(model, cache, static_prefill=static)
        seq = cache.new_sequence()
        a = generate_into(runner, seq, first, 6, stop_ids=[])
        b = generate_into(runner, seq, second, 10, stop_ids=[])
        outs.append((a, b, list(seq.tokens), cache.free_pages))
    assert outs[1] == outs[0]


def test_padding_that_does_not_fit_runs_at_the_true_size(tiny):
    """A pool of exactly the prompt's pages (34 tokens: 3 pages of 16), a model too short for
    the bucket: the prefill runs unpadded, and still gives the same logits."""
    model = load(tiny)
    prompt = prompt_ids(34)
    big = new_cache(model, MAX_LEN)
    expected = ModelRunner(model, big, static_prefill=False).forward(big.new_sequence(), prompt)
    cache = new_cache(model, num_pages=3, page_size=16)
    runner = ModelRunner(model, cache, static_prefill=True)
    seq = cache.new_sequence()
    logits = runner.forward(seq, prompt)
    assert runner.static_step(64) is None  # the 64-token bucket would need a fourth page
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    assert (len(seq.tokens), len(seq.pages), cache.free_pages) == (34, 3, 0)
    # Near the model's max_len: 150 cached + 9 new would be padded past 160 positions.
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache, static_prefill=True)
    seq = cache.new_sequence()
    runner.forward(seq, prompt_ids(150))
    runner.forward(seq, prompt_ids(9, seed=3))
    assert runner.static_step(16) is None and len(seq) == 159


def test_a_failed_padded_prefill_leaves_sequence_and_pool_as_they_were(tiny):
    model = load(tiny)
    cache = new_cache(model, MAX_LEN)
    runner = ModelRunner(model, cache, static_prefill=True)
    seq = cache.new_sequence()
    runner.forward(seq, prompt_ids(20))
    tokens, pages, free = list(seq.tokens), list(seq.pages), cache.free_pages
    with pytest.raises(ValueError, match="vocabulary"):
        runner.forward(seq, prompt_ids(12) + [model.config.vocab_size])
    assert (seq.tokens, seq.pages, cache.free_pages) == (tokens, pages, free)


def test_prepare_step_padding_moves_the_logits_row_and_is_checked(tiny):
    model = load(tiny)
    cache = new_cache(model, MAX_LEN)
    meta = prepare_step(cache, [cache.new_sequence()], [list(range(1, 17))], padding=5)
    assert meta.logit_rows.tolist() == [10]
    assert meta.context_lens.tolist() == [16]  # the padding runs: its keys are written
    for bad in (dict(padding=16), dict(padding=-1), dict(padding=2, all_logits=True)):
        seq = cache.new_sequence()
        with pytest.raises(ValueError, match="padding"):
            prepare_step(cache, [seq], [list(range(1, 17))], **bad)
        assert not seq.pages  # refused before reserving pages


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(0.8, top_p=0.9)], ids=str)
def test_graph_replayed_prefill_gives_the_tokens_of_its_first_eager_run(tiny, backend, sampling):
    """bf16 on the GPU: the first prefill of a bucket runs the padded step eagerly, the second
    captures it, the third replays it; all three give the same tokens as a runner without
    graphs running the same padded step, and the pool ends as it began."""
    model = load(tiny, backend, dtype=torch.bfloat16, device="cuda")
    prompt = prompt_ids(40)

    def run(runner, cache):
        seq = cache.new_sequence()
        out = generate_into(runner, seq, prompt, 30, sampling, stop_ids=[], seed=5)
        cache.release(seq)
        return out

    cache = new_cache(model, MAX_LEN)
    eager = run(ModelRunner(model, cache, graphs=False, static_prefill=True), cache)
    runner = ModelRunner(model, cache, graphs=True)
    outs = [run(runner, cache) for _ in range(3)]
    assert runner.static_step(64).graphs  # the 64-token bucket was captured
    assert outs == [eager] * 3
    assert cache.free_pages == cache.num_pages
