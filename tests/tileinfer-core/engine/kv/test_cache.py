"""The paged KV cache, step metadata and static (graph-style) steps: pages, truncation, errors
that leave everything unchanged, key smoothing."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backend.registry import list_backends
from tileinfer.engine.kv.cache import (ContextLengthError, OutOfPagesError, PagedKVCache,
                                    kv_bytes_per_token, new_cache)
from tileinfer.engine.generation.calibration import calibrate_key_smoothing, key_smoothing_from_calibration
from tileinfer.engine.generation.forward import forward
from tileinfer.engine.kv.step import StepMetadata, prepare_step, static_metadata
from tileinfer.model import load_model
from tileinfer_backend_ref.kv import store_kv  # the ground truth's cache writes
from tileinfer.model.config import config_from_dict
from tiny_models import COMMON, load_reference, prompt_ids, single_torch_thread, tiny  # noqa: F401

CONFIG = config_from_dict(dict(COMMON, model_type="qwen3"))


def _cache(num_pages=8, page_size=4, **kwargs):
    return PagedKVCache(CONFIG, num_pages, page_size=page_size, dtype=torch.float32,
                        device="cpu", **kwargs)


def _grow(cache, seq, n):
    """What a step does to the cache's bookkeeping: reserve, then append n tokens."""
    cache.reserve(seq, n)
    seq.tokens.extend(range(n))


def test_pages_follow_the_sequence_length():
    cache = _cache()
    a, b = cache.new_sequence(), cache.new_sequence()
    _grow(cache, a, 5)  # 2 pages of 4
    _grow(cache, b, 4)  # 1 page
    _grow(cache, a, 3)  # 8 positions: still 2 pages
    assert (len(a.pages), len(b.pages), cache.free_pages) == (2, 1, 5)
    assert set(a.pages).isdisjoint(b.pages)
    _grow(cache, a, 1)
    assert len(a.pages) == 3 and cache.free_pages == 4
    cache.truncate(a, 4)  # keeps page 1 of 3
    assert len(a) == 4 and len(a.pages) == 1 and cache.free_pages == 6
    cache.truncate(a, 3)  # within the page: nothing returned
    assert len(a.pages) == 1 and cache.free_pages == 6
    with pytest.raises(ValueError, match="cannot truncate a sequence of 3 tokens to 5"):
        cache.truncate(a, 5)
    cache.release(a)
    cache.release(b)
    assert (len(a), a.pages, cache.free_pages) == (0, [], 8)


def test_out_of_pages_is_raised_before_anything_changes():
    cache = _cache(num_pages=4, max_seq_len=64)
    a, b = cache.new_sequence(), cache.new_sequence()
    _grow(cache, a, 6)  # 2 pages
    pages, free = list(a.pages), cache.free_pages
    with pytest.raises(OutOfPagesError, match="needs 3 more pages, only 2 are free") as info:
        cache.reserve(a, 11)  # 17 positions: 5 pages
    assert (info.value.needed, info.value.free) == (3, 2)
    assert a.pages == pages and cache.free_pages == free
    # Several sequences at once: all or none.
    with pytest.raises(OutOfPagesError):
        cache.reserve_all([(a, 4), (b, 5)])  # 1 + 2 pages > 2
    assert a.pages == pages and b.pages == [] and cache.free_pages == free


def test_a_sequence_cannot_outgrow_the_cache_limit():
    cache = _cache(num_pages=8, max_seq_len=10)
    seq = cache.new_sequence()
    with pytest.raises(ContextLengthError, match="exceed the maximum sequence length 10 "
                                                 "\\(the cache's max_seq_len\\)"):
        cache.reserve(seq, 11)
    assert seq.pages == [] and cache.free_pages == 8


@pytest.mark.parametrize("quantize", [None, "int8"])
def test_kv_bytes_per_token_is_what_the_pools_take(quantize):
    cache = _cache(num_pages=3, page_size=16, quantize=quantize)
    assert kv_bytes_per_token(CONFIG, quantize, torch.float32) * 3 * 16 == cache.nbytes


def test_step_slots_put_each_position_where_the_block_table_says():
    """Keys stored at the step's slots come back in position order through the sequence's
    pages, for a batched step of sequences whose pages interleave."""
    cache = _cache(num_pages=8, page_size=4)
    a, b = cache.new_sequence(), cache.new_sequence()
    _grow(cache, a, 3)
    _grow(cache, b, 5)
    meta = prepare_step(cache, [a, b], [[1] * 6, [2] * 2], all_logits=False)
    assert meta.cu_seqlens_q.tolist() == [0, 6, 8] and meta.context_lens.tolist() == [9, 7]
    assert meta.positions.tolist() == list(range(3, 9)) + [5, 6]
    assert meta.logit_rows.tolist() == [5, 7] and meta.max_query_len == 6
    keys = torch.randn(8, CONFIG.num_kv_heads, CONFIG.head_dim)
    kv = cache.layer(0)
    store_kv(kv, keys, keys, meta.slots)
    a.tokens.extend([1] * 6)
    b.tokens.extend([2] * 2)
    assert torch.equal(cache.sequence_keys(0, a)[3:], keys[:6])
    assert torch.equal(cache.sequence_keys(0, b)[5:], keys[6:])
    for row, seq in enumerate((a, b)):  # block table rows: the pages, then padding
        assert meta.block_table[row, :len(seq.pages)].tolist() == seq.pages


def _pointers(obj):
    return [t.data_ptr() for t in vars(obj).values() if torch.is_tensor(t)]


def test_static_metadata_and_buffers_replay_eager_steps(tiny):
    """What a CUDA-graph runner does: one static StepMetadata and StepBuffers, refilled in place
    for every decode step; the logits are the eager ones and no tensor is reallocated."""
    model = load_model(tiny.directory("llama", False, torch.float32), dtype=torch.float32,
                       max_len=64)
    prompt = prompt_ids()
    eager_cache, static_cache = new_cache(model, 64, page_size=16), new_cache(model, 64, page_size=16)
    eager, seq = eager_cache.new_sequence(), static_cache.new_sequence()
    logits = forward(model, eager_cache, eager, prompt)
    forward(model, static_cache, seq, prompt)
    meta = static_metadata(model, 1, static_cache)
    buffers = model.new_buffers(1, 1)
    pointers = _pointers(meta) + _pointers(buffers)
    for _ in range(20):  # crosses the page boundary at 32
        token = int(logits[-1].argmax())
        logits = forward(model, eager_cache, eager, [token])
        prepare_step(static_cache, [seq], [[token]], max_len=model.max_len, out=meta, append=True)
        static_logits = model.forward_step(meta, buffers, static_cache)
        assert torch.equal(static_logits, logits)
        assert _pointers(meta) + _pointers(buffers) == pointers
    assert seq.tokens == eager.tokens
    with pytest.raises(ValueError, match="static step metadata holds 1 sequences, 1 tokens"):
        prepare_step(static_cache, [seq], [[1, 2]], max_len=model.max_len, out=meta)
    assert seq.tokens == eager.tokens


def test_out_of_pages_mid_generation_leaves_sequence_and_pool_unchanged(tiny):
    model = load_model(tiny.directory("qwen3", False, torch.bfloat16), max_len=128)
    cache = new_cache(model, num_pages=3, page_size=16)
    other = cache.new_sequence()
    forward(model, cache, other, [5])  # holds one page
    seq = cache.new_sequence()
    logits = forward(model, cache, seq, prompt_ids())
    tokens = []
    with pytest.raises(OutOfPagesError, match="needs 1 more pages, only 0 are free"):
        while True:  # position 32 needs a third page
            tokens.append(int(logits[-1].argmax()))
            tokens_before, pages_before = list(seq.tokens), list(seq.pages)
            pools_before = (cache.k_pages.clone(), cache.v_pages.clone())
            logits = forward(model, cache, seq, [tokens[-1]])
    assert len(tokens_before) == 32
    assert seq.tokens == tokens_before and seq.pages == pages_before and cache.free_pages == 0
    assert torch.equal(cache.k_pages, pools_before[0])
    assert torch.equal(cache.v_pages, pools_before[1])
    # Freeing the other sequence's page lets generation go on exactly as in a roomy cache.
    cache.release(other)
    resumed = [tokens[-1]]
    logits = forward(model, cache, seq, [tokens[-1]])
    for _ in range(5):
        resumed.append(int(logits[-1].argmax()))
        logits = forward(model, cache, seq, [resumed[-1]])
    roomy = new_cache(model, 128)
    ref_seq = roomy.new_sequence()
    logits = forward(model, roomy, ref_seq, prompt_ids())
    expected = []
    for _ in range(len(tokens) + 5):
        expected.append(int(logits[-1].argmax()))
        logits = forward(model, roomy, ref_seq, [expected[-1]])
    assert tokens[:-1] + resumed == expected


def test_prompt_longer_than_max_len_is_refused_before_anything_changes(tiny):
    model = load_model(tiny.directory("llama", False, torch.float32), dtype=torch.float32,
                       max_len=32)
    cache = new_cache(model, num_pages=8, page_size=16)
    seq = cache.new_sequence()
    with pytest.raises(ContextLengthError, match="0 cached \\+ 33 new tokens exceed the maximum "
                                                 "sequence length 32 \\(the model's max_len\\)"):
        forward(model, cache, seq, prompt_ids(33))
    assert seq.tokens == [] and seq.pages == [] and cache.free_pages == 8
    forward(model, cache, seq, prompt_ids(30))
    with pytest.raises(ContextLengthError, match="30 cached \\+ 3 new tokens"):
        forward(model, cache, seq, [1, 2, 3])
    assert len(seq) == 30 and len(seq.pages) == 2 and cache.free_pages == 6


def test_bad_token_ids_are_refused_before_anything_changes(tiny):
    model = load_model(tiny.directory("llama", False, torch.float32), dtype=torch.float32,
                       max_len=32)
    cache = new_cache(model, 32)
    seq = cache.new_sequence()
    with pytest.raises(ValueError, match="token id 512 is outside the vocabulary"):
        forward(model, cache, seq, [1, 512])
    with pytest.raises(ValueError, match="at least one new token"):
        forward(model, cache, seq, [])
    assert seq.pages == [] and cache.free_pages == cache.num_pages


# -- key smoothing ---------------------------------------------------------------------------

def test_key_smoothing_factors_follow_the_documented_procedure():
    torch.manual_seed(0)
    keys = torch.randn(100, 2, 8) * torch.tensor([1.0, 30.0, 1e-6, 2.0, 1.0, 1.0, 1.0, 1.0])
    keys[:, 1] = 0.0  # a silent head
    (factors,) = key_smoothing_from_calibration([keys])
    assert factors.shape == (2, 8) and bool((factors > 0).all())
    torch.testing.assert_close(factors.mean(-1), torch.ones(2))
    assert torch.equal(factors[1], torch.ones(8))
    amax = keys[:, 0].abs().amax(0)
    # Ratios of factors are square roots of ratios of ranges, for channels above the floor...
    torch.testing.assert_close(factors[0, 1] / factors[0, 0], (amax[1] / amax[0]).sqrt())
    # ...and the near-silent channel is held at the floor, 1e-2 of the largest range.
    torch.testing.assert_close(factors[0, 2] / factors[0, 1], torch.tensor(0.1))


def test_key_smoothing_reduces_int8_error_of_keys_with_outlier_channels():
    """Keys with a few large channels (as real models' keys after RoPE have): smoothing lowers
    the round-trip error of an INT8 cache, measured on held-out keys."""
    gen = torch.Generator().manual_seed(0)
    channel_scale = torch.ones(CONFIG.num_kv_heads, CONFIG.head_dim)
    channel_scale[:, :3] = 40.0

    def draw(n):
        return torch.randn(n, CONFIG.num_kv_heads, CONFIG.head_dim, generator=gen) * channel_scale

    factors = key_smoothing_from_calibration([draw(256)] * CONFIG.num_layers)
    errors = {}
    for name, smoothing in (("plain", None), ("smoothed", factors)):
        cache = _cache(num_pages=4, page_size=16, quantize="int8", key_smoothing=smoothing)
        seq = cache.new_sequence()
        meta = prepare_step(cache, [seq], [[0] * 64])
        seq.tokens.extend([0] * 64)
        keys = draw(64)
        kv = cache.layer(0)
        store_kv(kv, keys, keys, meta.slots)
        errors[name] = (cache.sequence_keys(0, seq) - keys)[..., 3:].abs().mean().item()
    assert errors["smoothed"] < 0.5 * errors["plain"], errors


def test_calibrated_smoothing_uses_the_keys_transformers_computes(tiny):
    directory = tiny.directory("qwen3", False, torch.float32)
    model = load_model(directory, dtype=torch.float32, max_len=64)
    ids = prompt_ids(40, seed=3)
    factors = calibrate_key_smoothing(model, ids)
    with torch.no_grad():
        cache = load_reference(directory, torch.float32)(torch.tensor([ids])).past_key_values
    hf_keys = [layer.keys[0].transpose(0, 1) for layer in cache.layers]  # (n, kv_heads, hd)
    expected = key_smoothing_from_calibration(hf_keys)
    for ours, theirs in zip(factors, expected):
        torch.testing.assert_close(ours.cpu(), theirs, rtol=1e-4, atol=1e-6)


# -- CUDA graphs (GPU) -----------------------------------------------------------------------

GRAPH_SAFE = [b.name for b in list_backends() if b.available and b.info.graph_safe]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", GRAPH_SAFE or [pytest.param("none", marks=pytest.mark.skip(
    reason="no graph-safe backend is available"))])
def test_forward_step_replays_in_a_cuda_graph(tiny, backend):
    """forward_step captured once in a CUDA graph with static metadata and buffers, replayed
    for each decode step, gives the eager logits."""
    model = load_model(tiny.directory("qwen3", False, torch.bfloat16), backend=backend,
                       device="cuda", max_len=128)
    prompt = prompt_ids()
    eager_cache, graph_cache = new_cache(model, 128), new_cache(model, 128)
    eager, seq = eager_cache.new_sequence(), graph_cache.new_sequence()
    logits = forward(model, eager_cache, eager, prompt)
    forward(model, graph_cache, seq, prompt)
    meta: StepMetadata = static_metadata(model, 1, graph_cache)
    buffers = model.new_buffers(1, 1)
    token = int(logits[-1].argmax())
    prepare_step(graph_cache, [seq], [[token]], max_len=model.max_len, out=meta)
    stream = torch.cuda.Stream()  # warm up (lazy compilation) off the capture
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        model.forward_step(meta, buffers, graph_cache)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model.forward_step(meta, buffers, graph_cache)
    for _ in range(20):
        logits = forward(model, eager_cache, eager, [token])
        graph.replay()
        seq.tokens.append(token)
        torch.testing.assert_close(out, logits, rtol=0, atol=1e-6)
        token = int(logits[-1].argmax())
        prepare_step(graph_cache, [seq], [[token]], max_len=model.max_len, out=meta)


@pytest.mark.gpu
def test_packed_static_metadata_matches_the_prepared_step():
    """On a GPU the static metadata is one buffer filled by one pinned copy per step: every view
    holds the prepared values, keep_ids leaves the device's ids alone, and the pinned ring
    reuses its buffers without overwriting a copy in flight."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    cache = PagedKVCache(CONFIG, 16, page_size=4, dtype=torch.float32, device="cuda")
    seq = cache.new_sequence()
    static = StepMetadata.for_cache(cache, num_tokens=2, num_logits=2)
    assert static.upload is not None and static.slots.dtype == torch.int64
    static.ids.fill_(-7)
    for step in range(10):  # more steps than the ring has buffers, no synchronization between
        ids = [3 + step, 5 + step]
        keep = step % 2 == 1
        fresh = prepare_step(cache, [seq], [ids], all_logits=True)
        prepare_step(cache, [seq], [ids], all_logits=True, out=static, keep_ids=keep)
        seq.tokens.extend(ids)
        torch.cuda.synchronize()
        for name in ("positions", "slots", "cu_seqlens_q", "context_lens", "block_table",
                     "logit_rows"):
            assert torch.equal(getattr(static, name).cpu(), getattr(fresh, name).cpu()), name
        expected_ids = torch.tensor(ids, dtype=torch.int32)
        if keep:
            expected_ids = torch.tensor([3 + step - 1, 5 + step - 1], dtype=torch.int32)
        assert torch.equal(static.ids.cpu(), expected_ids)
