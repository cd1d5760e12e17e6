"""The pieces under the serving engine: the reference-counted page allocator with cached pages,
prefix keys and matching, per-row batch sampling, graph buckets."""

from __future__ import annotations

import pytest
import torch

from tileinfer import SamplingParams, get_backend
from tileinfer.backend.sampling import sample_host
from tileinfer.engine.serving.batch_runner import bucket_sizes
from tileinfer.engine.serving.batch_sampling import sample_batch
from tileinfer.engine.kv.cache import OutOfPagesError, PageAllocator, PagedKVCache
from tileinfer.engine.kv.prefix_cache import PrefixCache, page_keys
from tileinfer.model.config import config_from_dict
from tiny_models import COMMON, single_torch_thread  # noqa: F401

CONFIG = config_from_dict(dict(COMMON, model_type="llama"))


def test_allocator_counts_references_and_keeps_published_pages_cached():
    alloc = PageAllocator(6)
    a = alloc.allocate(3)
    assert a == [0, 1, 2] and alloc.free == 3 and alloc.held == 3
    assert alloc.publish(0, "k0") and alloc.publish(1, "k1")
    assert not alloc.publish(2, "k0") and not alloc.publish(0, "other")  # key / page taken
    alloc.share([0, 1])
    assert (alloc.refcount(0), alloc.refcount(2)) == (2, 1)
    alloc.release(a)
    assert alloc.free == 4 and alloc.cached == 0 and alloc.check()["held"] == 2
    alloc.release([0, 1])
    assert alloc.free == 6 and alloc.cached == 2 and alloc.lookup("k1") == 1
    # Cached pages are taken back by sharing, not by allocating (plain free pages go first).
    alloc.share([alloc.lookup("k1")])
    assert alloc.allocate(4) == [2, 3, 4, 5] and alloc.lookup("k0") == 0
    assert alloc.allocate(1) == [0] and alloc.lookup("k0") is None  # evicted
    with pytest.raises(OutOfPagesError, match="needs 1 more pages, only 0 are free"):
        alloc.allocate(1)
    alloc.check(held_by=[[1], [2, 3, 4, 5], [0]])


def test_allocator_evicts_least_recently_released_and_a_sequence_tail_first():
    alloc = PageAllocator(5)
    first, second = alloc.allocate(2), alloc.allocate(2)
    for page in first + second:
        alloc.publish(page, ("key", page))
    alloc.release(first)  # released last page first: page 1, then page 0
    alloc.release(second)
    assert [alloc.allocate(1)[0] for _ in range(5)] == [4, 1, 0, 3, 2]


def test_allocator_refuses_double_release_and_sharing_a_free_page():
    alloc = PageAllocator(3)
    pages = alloc.allocate(2)
    alloc.release(pages)
    with pytest.raises(ValueError, match="released more often than it was taken"):
        alloc.release([pages[0]])
    with pytest.raises(ValueError, match="page 2 is free"):
        alloc.share([2])
    with pytest.raises(ValueError, match="not held"):
        alloc.publish(0, "k")
    alloc.check()


def test_allocator_check_catches_corrupted_bookkeeping():
    alloc = PageAllocator(4)
    pages = alloc.allocate(2)
    with pytest.raises(AssertionError, match="references differ"):
        alloc.check(held_by=[pages[:1]])
    alloc._refs[pages[0]] = 0  # a leak: unreferenced, yet neither free nor cached
    with pytest.raises(AssertionError, match="0 references but free=False"):
        alloc.check()


def test_plain_cache_behaviour_is_unchanged():
    """Without publishing, the allocator is the old one: lowest ids first, all back on release."""
    cache = PagedKVCache(CONFIG, 6, page_size=4, dtype=torch.float32, device="cpu")
    a, b = cache.new_sequence(), cache.new_sequence()
    cache.reserve(a, 9)
    cache.reserve(b, 4)
    assert a.pages == [0, 1, 2] and b.pages == [3]
    cache.release(a)
    cache.reserve(b, 8)
    assert b.pages == [3, 0] and cache.free_pages == 4
    cache.release(b)
    assert cache.allocator.check() == {"held": 0, "cached": 0, "free": 6}


def test_prefix_keys_chain_every_token_before_a_page_end():
    tokens = list(range(10))
    keys = page_keys(tokens, 4)
    assert len(keys) == 2 and keys[0][1] == (0, 1, 2, 3) and keys[1][0] == hash(keys[0])
    assert page_keys(tokens, 4, keys[0], 1) == keys[1:]
    other = page_keys([9] + tokens[1:], 4)  # same second page, different first token
    assert other[1][1] == keys[1][1] and other[1] != keys[1]


def test_prefix_attach_takes_whole_cached_pages_and_leaves_a_token_to_run():
    cache = PagedKVCache(CONFIG, 8, page_size=4, dtype=torch.float32, device="cpu")
    prefix = PrefixCache(cache)
    owner = cache.new_sequence()
    tokens = list(range(12))
    cache.reserve(owner, 12)
    owner.tokens.extend(tokens)
    keys = []
    prefix.publish(owner, keys)
    assert len(keys) == 3
    assert prefix.cached_pages_of(tokens + [7]) == (3, 0)
    seq = cache.new_sequence()
    taken = prefix.attach(seq, tokens)  # 12 tokens: 2 pages, the third runs again
    assert taken == keys[:2] and seq.pages == owner.pages[:2] and seq.tokens == tokens[:8]
    assert [cache.allocator.refcount(p) for p in owner.pages] == [2, 2, 1]
    cache.release(owner)
    assert prefix.cached_pages_of(tokens + [7]) == (3, 1)  # the third page is idle now
    miss = cache.new_sequence()
    assert prefix.attach(miss, [1] + tokens[1:]) == [] and miss.pages == []
    cache.release(seq)
    assert cache.allocator.check() == {"held": 0, "cached": 3, "free": 5}
    assert prefix.hit_tokens == 8


def test_sample_batch_gives_each_row_its_own_stream():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 64, generator=gen) * 3
    greedy, hot = SamplingParams(), SamplingParams(1.0, top_k=8)
    nucleus = SamplingParams(0.7, top_p=0.8)
    params = [hot, greedy, nucleus, hot, hot, greedy, hot]
    seeds = [5, 1, 5, 5, 9, 2, 5]
    counters = [3, 0, 3, 4, 0, 7, 9]  # rows 0 and 3: one seed, consecutive counters
    calls = []
    ops = get_backend("ref")

    class Spy:  # a backend without the optional sample_per_row
        sample_per_row = None

        def sample_tokens(self, out, rows, *args):
            calls.append(rows.shape[0])
            ops.sample_tokens(out, rows, *args)

    class PerRow:  # one with it
        def sample_per_row(self, out, rows, *args):
            calls.append(("per row", rows.shape[0]))
            ops.sample_per_row(out, rows, *args)

    out = sample_batch(Spy(), logits, params, seeds, counters)
    expected = [sample_host(logits[r], params[r], seeds[r], counters[r]) for r in range(7)]
    assert out.dtype == torch.int32 and out.tolist() == expected
    # greedy rows in one call; rows 0 and 3 in one; rows 2, 4, 6 alone.
    assert sorted(calls) == [1, 1, 1, 2, 2]
    calls.clear()
    out = sample_batch(PerRow(), logits, params, seeds, counters)
    assert out.dtype == torch.int32 and out.tolist() == expected
    assert calls == [("per row", 7)]
    with pytest.raises(ValueError, match="7 logit rows, 6 params"):
        sample_batch(ops, logits, params[:6], seeds, counters)


def test_sample_batch_writes_the_rows_sums():
    """With sums: each row's logit sum (the finite check's), from the sampling call itself when
    every row is greedy and the backend has sample_tokens_with_sums, else from torch."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 64, generator=gen) * 3
    logits[3, 9] = float("nan")
    ops = get_backend("ref")
    calls = []

    class Fused:  # a backend with the optional op
        sample_per_row = None

        def sample_tokens_with_sums(self, out, sums, rows, *args):
            calls.append("with sums")
            ops.sample_tokens_with_sums(out, sums, rows, *args)

        def sample_tokens(self, out, rows, *args):
            calls.append("plain")
            ops.sample_tokens(out, rows, *args)

    class Plain(Fused):  # and one without it
        sample_tokens_with_sums = None

    greedy = [SamplingParams()] * 5
    mixed = greedy[:4] + [SamplingParams(0.8)]
    for backend, params, expected_calls in ((Fused(), greedy, ["with sums"]),
                                            (Plain(), greedy, ["plain"]),
                                            (Fused(), mixed, ["plain", "plain"])):
        calls.clear()
        sums = torch.full((5,), 7.0)
        out = sample_batch(backend, logits, params, [3] * 5, list(range(5)), sums=sums)
        assert calls == expected_calls
        assert out.tolist() == [sample_host(logits[r], params[r], 3, r) for r in range(5)]
        assert torch.isfinite(sums).tolist() == [True, True, True, False, True]
        assert torch.allclose(sums[[0, 1, 2, 4]], logits[[0, 1, 2, 4]].sum(dim=1))


def test_bucket_sizes():
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert bucket_sizes(48) == [1, 2, 4, 8, 16, 32, 64]
