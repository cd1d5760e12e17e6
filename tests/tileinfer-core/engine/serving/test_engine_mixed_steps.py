"""Steps with prefill chunks padded to static shapes (``BatchRunner(static_mixed=True)``,
engine/serving/mixed_steps.py): the shapes and their padding, and the engine's outputs with them equal to
each request run alone (float32 on the CPU, where the static steps run eagerly: what a graph
replays), through chunked prefill, preemption and prefix hits."""

from __future__ import annotations

import random

import pytest
import torch

from tileinfer import LLMEngine, SamplingParams, load_model
from tileinfer.engine.serving.mixed_steps import (MIXED_MAX_TOKENS, MixedShape, mixed_shape,
                                          padding_lengths, query_bucket, token_bucket)
from test_engine_exactness import SAMPLINGS, alone, load, mixed_requests, run_engine
from gpu_params import gpu_backends
from tiny_models import prompt_ids, tiny  # noqa: F401

BUCKETS = [1, 2, 4, 8, 16, 32, 64]


def test_token_and_query_buckets():
    assert [token_bucket(n) for n in (1, 16, 17, 128, 129, 192, 193, 512)] == [
        16, 16, 32, 128, 192, 192, 256, 512]
    assert token_bucket(MIXED_MAX_TOKENS + 1) is None
    assert [query_bucket(q) for q in (1, 16, 17, 100)] == [16, 16, 32, 128]


def test_a_static_batch_prefill_needs_no_padding():
    # 8 prompts of 16 tokens: 128 tokens, 8 sequences, queries of 16.
    assert mixed_shape(8, 128, 16, BUCKETS) == MixedShape(128, 8, 16)
    assert padding_lengths(MixedShape(128, 8, 16), 8, 128) == []


def test_padding_goes_to_padding_sequences_within_the_query_bound():
    # 3 sequences: a 20-token chunk and two decode rows -> 4 sequences, 32 tokens, queries <= 32.
    shape = mixed_shape(3, 22, 20, BUCKETS)
    assert shape == MixedShape(32, 4, 32)
    assert padding_lengths(shape, 3, 22) == [10]
    # 8 sequences fill their bucket: the padding needs a ninth, so the batch bucket is 16.
    shape = mixed_shape(8, 30, 16, BUCKETS)
    assert shape == MixedShape(48, 16, 16)
    assert padding_lengths(shape, 8, 30) == [11, 1, 1, 1, 1, 1, 1, 1]


def test_the_query_bucket_stays_within_max_len():
    # A 100-token chunk on a model of 120 positions: queries bounded by 120, not 128.
    shape = mixed_shape(2, 101, 100, BUCKETS, max_len=120)
    assert shape == MixedShape(112, 4, 120)
    assert max(padding_lengths(shape, 2, 101)) <= 120


def test_no_shape_past_the_buckets():
    assert mixed_shape(3, MIXED_MAX_TOKENS, 200, BUCKETS) is None  # no room for padding tokens
    assert mixed_shape(64, 100, 30, BUCKETS) is None  # no padding sequence left
    assert mixed_shape(9, 100, 30, [1, 2, 4, 8]) is None  # more sequences than buckets


def test_every_shape_holds_its_step_and_padding():
    rng = random.Random(0)
    for _ in range(3000):
        b = rng.randint(1, 70)
        t = rng.randint(b, 600)
        q = rng.randint(-(-t // b), min(t - b + 1, 600))  # some sequence has the longest query
        shape = mixed_shape(b, t, q, BUCKETS)
        if shape is None:
            continue
        assert shape.batch in BUCKETS and shape.batch >= b and shape.tokens >= t
        assert shape.max_query >= q and shape.tokens <= MIXED_MAX_TOKENS
        lengths = padding_lengths(shape, b, t)
        assert len(lengths) == shape.batch - b and sum(lengths) == shape.tokens - t
        assert all(1 <= n <= shape.max_query for n in lengths)


@pytest.mark.parametrize("sampling", [SAMPLINGS[0], SAMPLINGS[2]], ids=str)
def test_padded_mixed_steps_give_each_request_its_own_tokens(tiny, sampling):
    """Chunks of at most 24 tokens mixed with decode rows, run padded (and the decode steps
    from their buckets): every request's tokens equal its run alone, the pool checked after
    every step."""
    model = load(tiny)
    requests = mixed_requests(sampling=[sampling])
    engine = LLMEngine(model, num_pages=40, max_running=8, max_step_tokens=24,
                       static_decode=True, static_mixed=True)
    out, reasons = run_engine(engine, requests)
    assert out == [alone(model, r) for r in requests]
    assert reasons == ["length"] * len(requests)
    stats = engine.stats()
    assert stats["static_mixed_steps"] >= 3
    assert 0 < len(engine.runner.mixed_steps_kept()) <= engine.runner.steps.max_kept


def test_padded_mixed_steps_under_preemption_and_prefix_hits(tiny):
    model = load(tiny)
    requests = mixed_requests(lengths=(20, 33, 5, 40, 17, 26), news=(30, 20, 40, 18, 30, 25))
    engine = LLMEngine(model, num_pages=7, page_size=16, max_step_tokens=40, max_running=8,
                       static_decode=True, static_mixed=True)
    out, _ = run_engine(engine, requests)
    assert engine.stats()["preemptions"] >= 1 and engine.stats()["static_mixed_steps"] >= 1
    assert out == [alone(model, r) for r in requests]
    shared = prompt_ids(40, seed=7)
    later = [dict(prompt_ids=shared + prompt_ids(n, seed=20 + n), max_new_tokens=6,
                  stop_ids=[], seed=n, sampling=SamplingParams()) for n in (1, 9, 30)]
    engine = LLMEngine(model, num_pages=30, max_running=8, static_decode=True,
                       static_mixed=True)
    out, _ = run_engine(engine, later[:1])
    out += run_engine(engine, later[1:])[0]
    assert engine.stats()["prefix_hit_tokens"] == 2 * 32
    assert out == [alone(model, r) for r in later]


def test_past_the_build_budget_new_shapes_run_eagerly(tiny, monkeypatch):
    """With shapes that keep changing, the runtime builds at most ``max_builds`` static mixed
    shapes; later steps of shapes it does not keep run eagerly at their true size, those of a
    kept shape still run padded, and every request's tokens equal its run alone."""
    model = load(tiny)
    requests = mixed_requests(lengths=(20, 33, 5, 40, 17, 26), news=(6, 5, 7, 4, 6, 5))
    engine = LLMEngine(model, num_pages=40, max_running=8, max_step_tokens=24,
                       static_decode=True, static_mixed=True)
    runner = engine.runner
    monkeypatch.setattr(runner.steps, "max_builds", 2)
    seen = []  # the shape of every step that ran padded
    real_run_mixed = runner._run_mixed

    def run_mixed(shape, seqs, token_lists, tokens):
        seen.append(shape)
        return real_run_mixed(shape, seqs, token_lists, tokens)

    monkeypatch.setattr(runner, "_run_mixed", run_mixed)
    out, _ = run_engine(engine, requests)
    assert out == [alone(model, r) for r in requests]
    assert runner.steps.builds == 2 and len(set(seen)) == 2
    assert len(seen) > 2  # a kept shape ran padded again after the budget was spent
    assert runner.eager_steps > 0  # the other shapes ran eagerly


@pytest.mark.gpu
@pytest.mark.parametrize("backend", gpu_backends())
def test_mixed_step_graphs_replay_the_first_eager_run(tiny, backend):
    """bf16 on the GPU with CUDA graphs: the same batch three times (its prefill step's shape
    runs eagerly, then is captured, then replayed) gives the same tokens each time, and the
    pool ends as it began."""
    model = load_model(tiny.directory("llama", dtype=torch.bfloat16), dtype=torch.bfloat16,
                       backend=backend, max_len=128, device="cuda")
    engine = LLMEngine(model, num_pages=64, max_running=8, static_mixed=True)
    requests = mixed_requests(lengths=(16, 16, 16, 16), news=(10, 10, 10, 10))
    outs = [run_engine(engine, requests)[0] for _ in range(3)]
    assert outs[1] == outs[0] and outs[2] == outs[0]
    assert engine.stats()["static_mixed_steps"] >= 3
    assert any(step.graphs for step in engine.runner.mixed_steps_kept().values())
