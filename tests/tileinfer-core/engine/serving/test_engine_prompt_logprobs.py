"""Prompt log-probabilities (``add_request(..., prompt_logprobs=k)``) equal, exactly (float32
on the CPU), the log-softmax of a plain forward of the prompt with every row's logits: with
chunked prefill, in a batch with other requests, with the prompt's prefix cached in the pool,
after a preemption. max_new_tokens 0 only scores the prompt; every request's tokens stay those
of ``generate`` alone.

The ref backend computes a step of at most ROW_INVARIANT_MAX_TOKENS (32) tokens row by row, so
a row's values do not depend on the rows around it; a longer step takes whole-tensor ops whose
sums depend on its shape (1e-6 apart). So the engines here take steps of at most 32 tokens, and
the reference forward runs in chunks of 16."""

from __future__ import annotations

import pytest
import torch

from tileinfer import LLMEngine, RequestError, SamplingParams, forward, new_cache
from tiny_models import prompt_ids, single_torch_thread, tiny  # noqa: F401

from test_engine_exactness import alone, load, run_engine


def expected(model, prompt, k, chunk=16):
    """[None, (logprob, [(id, logprob) x k]) per prompt token after the first], from a forward
    of the prompt in chunks of ``chunk`` tokens."""
    cache = new_cache(model, num_pages=16, page_size=16)
    seq = cache.new_sequence()
    logits = torch.cat([forward(model, cache, seq, prompt[i:i + chunk], all_logits=True).clone()
                        for i in range(0, len(prompt), chunk)])
    lp = torch.log_softmax(logits.float(), dim=-1)
    out = [None]
    for p in range(len(prompt) - 1):
        top_v, top_i = lp[p].topk(k)
        out.append((lp[p, prompt[p + 1]].item(), list(zip(top_i.tolist(), top_v.tolist()))))
    return out


def run_collecting(engine, requests):
    """Every request's (tokens, finish reason, prompt_logprobs, outputs carrying them)."""
    ids = [engine.add_request(**r) for r in requests]
    got = {rid: ([], None, None, 0) for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            tokens, reason, plp, carried = got[out.request_id]
            tokens.extend(out.new_tokens)
            if out.prompt_logprobs is not None:
                plp, carried = out.prompt_logprobs, carried + 1
            got[out.request_id] = (tokens, out.finish_reason or reason, plp, carried)
        engine.check_accounting()
    assert engine.check_accounting()["pages_used"] == 0
    return [got[rid] for rid in ids]


def scored(n, seed, k=3, new=4):
    return dict(prompt_ids=prompt_ids(n, seed=seed), max_new_tokens=new, stop_ids=[], seed=seed,
                prompt_logprobs=k)


def plain(n, seed, new=6):
    return dict(prompt_ids=prompt_ids(n, seed=seed), max_new_tokens=new, stop_ids=[], seed=seed)


def test_chunked_prefill_in_a_batch(tiny):
    model = load(tiny)
    requests = [plain(20, 1), scored(45, 2, k=3), plain(7, 3, new=9), scored(1, 4, k=2),
                scored(17, 5, k=0, new=1)]
    engine = LLMEngine(model, num_pages=40, page_size=16, max_step_tokens=12)
    results = run_collecting(engine, requests)
    for r, (tokens, reason, plp, carried) in zip(requests, results):
        assert tokens == alone(model, r) and reason == "length"
        if r.get("prompt_logprobs") is None:
            assert plp is None and carried == 0
        else:
            assert carried == 1  # reported once
            assert plp == expected(model, r["prompt_ids"], r["prompt_logprobs"])
    assert engine.stats()["eager_steps"] > 0


def test_max_new_tokens_zero_scores_the_prompt_only(tiny):
    model = load(tiny)
    engine = LLMEngine(model, num_pages=20, page_size=16, max_step_tokens=32)
    r = scored(30, 7, k=5, new=0)
    [(tokens, reason, plp, carried)] = run_collecting(engine, [r])
    assert tokens == [] and reason == "length" and carried == 1
    assert plp == expected(model, r["prompt_ids"], 5)
    with pytest.raises(RequestError, match="max_new_tokens"):
        engine.add_request(prompt_ids(5), max_new_tokens=0)
    for bad in (21, -1, True, 1.5):
        with pytest.raises(RequestError, match="prompt_logprobs"):
            engine.add_request(prompt_ids(5), prompt_logprobs=bad)


def test_a_cached_prefix_is_not_taken(tiny):
    """The prompt's pages are in the prefix cache: a scoring request recomputes them (its rows'
    logits), a plain request with the same prompt still takes them."""
    model = load(tiny)
    engine = LLMEngine(model, num_pages=30, page_size=16, max_step_tokens=32)
    first = plain(40, 8, new=2)
    run_engine(engine, [first])
    hits = engine.stats()["prefix_hit_tokens"]
    r = dict(scored(40, 8, k=2, new=3))
    [(tokens, _, plp, _)] = run_collecting(engine, [r])
    assert engine.stats()["prefix_hit_tokens"] == hits  # nothing taken from the cache
    assert plp == expected(model, r["prompt_ids"], 2) and tokens == alone(model, r)
    run_engine(engine, [plain(40, 8, new=2)])
    assert engine.stats()["prefix_hit_tokens"] > hits


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_after_preemption(tiny, prefix_caching):
    model = load(tiny)
    engine = LLMEngine(model, num_pages=6, page_size=16, max_step_tokens=20,
                       prefix_caching=prefix_caching)
    requests = [plain(30, 9, new=30), scored(40, 10, k=2, new=20), plain(20, 11, new=25),
                dict(scored(35, 12, k=1, new=10), sampling=SamplingParams(0.9, top_k=20))]
    results = run_collecting(engine, requests)
    assert engine.stats()["preemptions"] > 0
    for r, (tokens, _, plp, carried) in zip(requests, results):
        assert tokens == alone(model, r)
        if r.get("prompt_logprobs") is not None:
            assert carried == 1 and plp == expected(model, r["prompt_ids"], r["prompt_logprobs"])
