"""CUDA paged attention on the GPU, against ref: attention.cu and attention_decode.cu at model
shapes and in several launch configurations, across page and tile boundaries; each row of a
verify step equal to its 1-token step bit for bit, also on a workspace sized for another cache;
the fused attention inputs (attention_with_inputs) equal to the two ops bit for bit, cache
included."""

from __future__ import annotations

import pytest
import torch
from tileinfer.testing.conformance import (assert_close, attention_step, decode_step_inputs,
                                           fill_paged_step, qk_transform)

from cuda_gpu import DEV, loaded_modules

pytestmark = pytest.mark.gpu

KINDS = ["bf16", "int8", "int8-smooth"]


def _experiment(settings):
    from tileinfer_backend_cuda.ops import tuning

    return tuning.experiment(settings)


def _run(backend, q, cache, step, scale, causal, ws):
    out = torch.full_like(q, float("nan"))
    backend.attention(out, q, cache.kv, step, scale, causal, ws)
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", [
    ([1, 1, 1], [4000, 1, 2500], 32, 8, 128, 16),   # batched decode, long contexts: many splits
    ([4, 1], [1500, 900], 32, 8, 128, 64),           # a verify block beside a decode row
    ([1], [3000], 9, 3, 64, 16),                     # SmolLM2 heads
    ([200], [700], 16, 4, 128, 16),                  # chunked prefill after 500 cached
])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "block"])
def test_attention_model_shapes(cuda, ref, kind, case, causal):
    q_lens, context_lens, heads, kv_heads, head_dim, page_size = case
    gen = torch.Generator().manual_seed(sum(context_lens))
    q, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, DEV, gen)
    scale = head_dim ** -0.5
    step = attention_step(cu, ctx, table, max(q_lens), table.shape[1] * page_size)
    ws = cuda.attention_workspace(q.shape[0], heads, head_dim, step.max_context_len, q.device)
    expected = _run(ref, q, cache, step, scale, causal, None)
    # the split counters reset themselves: repeated calls agree exactly
    results = [_run(cuda, q, cache, step, scale, causal, ws) for _ in range(3)]
    assert_close(results[0], expected)
    assert torch.equal(results[0], results[1]) and torch.equal(results[1], results[2])


# attention.cu's configurations (decode steps on it: "decode" off) and attention_decode.cu's.
ATTN_SWEEP_SAMPLE = [{"decode": False, "stages": 3}, {"decode": False, "blocks_per_sm": 1, "stages": 3},
                     {"decode": False, "blocks_per_sm": 6}, {"decode_blocks_per_sm": 1, "decode_stages": 2},
                     {"decode_blocks_per_sm": 4, "decode_stages": 1}, {"decode_stages": 4},
                     {"decode_blocks_per_sm": 3}, {"decode_combine_batch": 32, "decode_min_split_tiles": 4},
                     {"decode_pdl_trigger": "start", "decode_m_tiles": 1}]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cfg", ATTN_SWEEP_SAMPLE, ids=str)
def test_attention_configs_match_ref(cuda, ref, kind, cfg):
    gen = torch.Generator().manual_seed(5)
    q_lens, context_lens, heads, kv_heads, head_dim, page_size = [1, 4, 1], [9000, 1500, 70], 32, 8, 128, 16
    q, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, DEV, gen)
    scale = head_dim ** -0.5
    step = attention_step(cu, ctx, table, max(q_lens), table.shape[1] * page_size)
    ws = cuda.attention_workspace(q.shape[0], heads, head_dim, step.max_context_len, q.device)
    expected = _run(ref, q, cache, step, scale, True, None)
    with _experiment({"attention": cfg}):
        out = _run(cuda, q, cache, step, scale, True, ws)
        again = _run(cuda, q, cache, step, scale, True, ws)
    assert_close(out, expected)
    assert torch.equal(out, again)


def _assert_rows_equal_one_token_steps(cuda, out, q, cache, table, context, max_ctx, scale, ws):
    """Row i of out (a k-token causal step's output, k = len(q)) equals the 1-token step at
    position context - 1 + i on the same cache, bit for bit."""
    cu1 = torch.tensor([0, 1], dtype=torch.int32, device=DEV)
    for i in range(q.shape[0]):
        ctx = torch.tensor([context + i], dtype=torch.int32, device=DEV)
        one = _run(cuda, q[i:i + 1].contiguous(), cache, attention_step(cu1, ctx, table, 1, max_ctx),
                   scale, True, ws)
        assert torch.equal(one[0], out[i]), f"row {i} of the {q.shape[0]}-token step differs"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", [2, 8])
@pytest.mark.parametrize("context", [40, 1500])
def test_attention_verify_rows_equal_decode_rows(cuda, kind, k, context):
    """Row i of a k-token causal step (positions context - 1 .. context + k - 2) equals the
    1-token step at position context - 1 + i on the same cache, bit for bit."""
    heads, kv_heads, head_dim, page_size = 32, 8, 128, 16
    gen = torch.Generator().manual_seed(context + k)
    total = context + k - 1
    q, cache, _, _, table = fill_paged_step([k], [total], heads, kv_heads, head_dim, page_size,
                                            kind, DEV, gen)
    scale = head_dim ** -0.5
    max_ctx = table.shape[1] * page_size
    ws = cuda.attention_workspace(k, heads, head_dim, max_ctx, q.device)
    cu = torch.tensor([0, k], dtype=torch.int32, device=DEV)
    step = attention_step(cu, torch.tensor([total], dtype=torch.int32, device=DEV), table, k, max_ctx)
    out = _run(cuda, q, cache, step, scale, True, ws)
    _assert_rows_equal_one_token_steps(cuda, out, q, cache, table, context, max_ctx, scale, ws)


# --- attention_with_inputs: attention_decode.cu's fused attention inputs ------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qknorm"])
@pytest.mark.parametrize("case", [  # q_lens, context_lens, heads, kv_heads, head_dim, page_size
    ([1], [1], 32, 8, 128, 16),                      # first token: one split
    ([1], [144], 32, 8, 128, 16),                    # the profiled decode step (3 splits)
    ([1, 1, 1], [4000, 1, 2500], 32, 8, 128, 16),    # batched, long contexts: many splits
    ([1], [3000], 9, 3, 64, 64),                     # SmolLM2 heads, pages of 64
    ([1, 1], [700, 65], 16, 2, 256, 16),             # head_dim 256, GQA 8
])
def test_fused_attention_inputs_equal_the_two_ops(cuda, kind, qk_norm, case):
    """1-token steps: the fused kernel gives the bits of attention_inputs then attention (the
    decode_fused_inputs = False path), in the output and in every byte of the cache; its rows
    therefore also equal a verify step's, which runs the two ops."""
    q_lens, context_lens, heads, kv_heads, head_dim, page_size = case
    gen = torch.Generator().manual_seed(sum(context_lens) + head_dim)
    _, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, DEV, gen)
    qkv, positions, slots = decode_step_inputs(q_lens, context_lens, table.cpu(), heads, kv_heads,
                                               head_dim, page_size, DEV, gen)
    qk = qk_transform(head_dim, 8192, DEV, qk_norm, gen)
    n, max_ctx = qkv.shape[0], table.shape[1] * page_size
    step = attention_step(cu, ctx, table, 1, max_ctx, positions, slots)
    ws = cuda.attention_workspace(n, heads, head_dim, max_ctx, DEV)
    results = []
    for fused in (True, False):
        pools = cache.clone()
        out = torch.full((n, heads, head_dim), float("nan"), dtype=torch.bfloat16, device=DEV)
        with _experiment({"attention": {"decode_fused_inputs": fused}}):
            cuda.attention_with_inputs(out, torch.empty_like(out), pools.kv, qkv, qk, step,
                                       head_dim ** -0.5, True, ws)
        results.append((out, pools))
    assert loaded_modules("attention_decode.cu", FUSED_INPUTS=1), "the fused kernel did not run"
    (fused_out, fused_cache), (two_ops_out, two_ops_cache) = results
    assert not fused_out.isnan().any()
    assert torch.equal(fused_out, two_ops_out)
    for name in ("k", "v", "k_scale", "v_scale"):  # bit patterns: unwritten slots hold NaN
        a, b = getattr(fused_cache, name), getattr(two_ops_cache, name)
        assert (a is None and b is None) or torch.equal(a.view(torch.uint8), b.view(torch.uint8)), \
            f"{name} differs"


# --- decode attention (attention_decode.cu: the warps split each key tile) -----------------------

# Contexts across page (16 or 64) and tile (64) boundaries, and query tokens (1..12, 32 in all:
# the workspace's capacity); the rows of a step cross the boundaries too.
DECODE_CONTEXTS = [1, 15, 16, 17, 63, 64, 65, 130, 1000, 5000]
DECODE_Q_LENS = [1, 2, 3, 8, 1, 12, 1, 1, 1, 2]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "block"])
def test_decode_attention_matches_ref(cuda, ref, kind, head_dim, group, page_size, causal):
    """Steps of 1..12 query tokens per sequence: a batch of every context (few splits) and each
    sequence alone (the context split over many blocks), against ref."""
    kv_heads = 2
    heads = kv_heads * group
    q_lens = DECODE_Q_LENS
    contexts = [max(c, n) for c, n in zip(DECODE_CONTEXTS, q_lens)]
    gen = torch.Generator().manual_seed(head_dim + group + page_size)
    q, cache, cu, ctx, table = fill_paged_step(q_lens, contexts, heads, kv_heads, head_dim,
                                               page_size, kind, DEV, gen)
    scale = head_dim ** -0.5
    max_ctx = table.shape[1] * page_size
    ws = cuda.attention_workspace(q.shape[0], heads, head_dim, max_ctx, q.device)
    step = attention_step(cu, ctx, table, max(q_lens), max_ctx)
    expected = _run(ref, q, cache, step, scale, causal, None)
    out = _run(cuda, q, cache, step, scale, causal, ws)
    assert loaded_modules("attention_decode.cu"), "the decode kernel did not run"
    assert_close(out, expected, what="batched step")
    for b, n in enumerate(q_lens):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        alone = attention_step(torch.tensor([0, n], dtype=torch.int32, device=DEV),
                               ctx[b:b + 1].contiguous(), table[b:b + 1].contiguous(), n, max_ctx)
        one = _run(cuda, q[rows].contiguous(), cache, alone, scale, causal, ws)
        assert_close(one, expected[rows], what=f"sequence {b} alone ({n} tokens, {contexts[b]} keys)")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("head_dim,group", [(128, 4), (64, 8), (128, 1), (256, 4), (64, 2)],
                         ids=["d128-g4", "d64-g8", "d128-g1", "d256-g4", "d64-g2"])
@pytest.mark.parametrize("k", [2, 5, 8, 16])
@pytest.mark.parametrize("where", ["short", "tile", "split"])
def test_decode_attention_verify_rows_equal_one_token_rows(cuda, ref, kind, head_dim, group, k,
                                                           where):
    """Row i of a k-token causal step equals the 1-token step at its position bit for bit, with
    the k positions across a tile boundary (at 64 or 1024 keys) or across the context length at
    which the keys per split grow (64 * num_splits: that step's rows split the context
    differently, and the block loads two runs of tiles). d256-g4 and d64-g8 have two row tiles
    at 8 tokens, four at 16 (a DFlash block)."""
    from tileinfer_backend_cuda.ops import attention

    heads, kv_heads, page_size = 8 * group, 8, 16
    device = torch.cuda.current_device()
    splits = attention.attention_decode_splits(1, kv_heads, attention.MAX_SPLITS, device)
    boundary = {"short": 64, "tile": 1024, "split": 64 * splits}[where]
    total = boundary + k // 2  # the rows see total - k + 1 .. total keys: boundary and boundary + 1
    context = total - k + 1
    gen = torch.Generator().manual_seed(total + k + head_dim)
    q, cache, _, _, table = fill_paged_step([k], [total], heads, kv_heads, head_dim, page_size,
                                            kind, DEV, gen)
    scale = head_dim ** -0.5
    max_ctx = max(table.shape[1] * page_size, 64 * 64 * 4)  # enough for `splits` splits
    ws = cuda.attention_workspace(k, heads, head_dim, max_ctx, q.device)
    assert attention.attention_decode_splits(1, kv_heads, ws.shape[2], device) == splits
    cu = torch.tensor([0, k], dtype=torch.int32, device=DEV)
    step = attention_step(cu, torch.tensor([total], dtype=torch.int32, device=DEV), table, k, max_ctx)
    out = _run(cuda, q, cache, step, scale, True, ws)
    expected = _run(ref, q, cache, step, scale, True, None)
    assert_close(out, expected)
    _assert_rows_equal_one_token_steps(cuda, out, q, cache, table, context, max_ctx, scale, ws)


@pytest.mark.parametrize("total", [70, 300, 1100])
def test_decode_attention_does_not_depend_on_the_cache_size(cuda, total):
    """The same step on workspaces sized for caches of different lengths (a draft model that is
    the target itself keeps a smaller cache) gives the same bits: the split boundaries of a row
    depend on its own context only."""
    heads, kv_heads, head_dim, page_size = 32, 8, 64, 16
    gen = torch.Generator().manual_seed(total)
    q, cache, _, _, table = fill_paged_step([1], [total], heads, kv_heads, head_dim, page_size,
                                            "bf16", DEV, gen)
    cu = torch.tensor([0, 1], dtype=torch.int32, device=DEV)
    ctx = torch.tensor([total], dtype=torch.int32, device=DEV)
    outs = []
    for max_ctx in (table.shape[1] * page_size, 32768):
        ws = cuda.attention_workspace(1, heads, head_dim, max_ctx, q.device)
        outs.append(_run(cuda, q, cache, attention_step(cu, ctx, table, 1, max_ctx),
                         head_dim ** -0.5, True, ws))
    assert torch.equal(outs[0], outs[1])
