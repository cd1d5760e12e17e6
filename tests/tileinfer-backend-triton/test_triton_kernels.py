"""Triton backend checks beyond the shipped conformance suite: every launch path the heuristics
can choose (split-K on and off, unrolled and tensor-core GEMV, the tiled GEMM, split-KV on and
off, odd GQA groups and head sizes, float32 models), the split-K counters re-arming between
launches, sampling token-identical to ``tileinfer.backend.sampling`` over many seeds and
counters, and the kernels that no op of the contract exposes (RoPE, the KV store, the
standalone activations), launched directly against the ref backend's helpers.

They run wherever the triton backend is available: under ``TRITON_INTERPRET=1`` on the CPU (CI,
small shapes) and on a CUDA GPU.
"""

from __future__ import annotations

from dataclasses import astuple

import pytest
import torch

from tileinfer.backend.registry import BackendError, get_backend
from tileinfer.backend.sampling import SamplingParams, accept_host, sample_host
from tileinfer.testing.conformance import (
    CACHE_KINDS,
    XIELU,
    Cache,
    assert_cache_equal,
    assert_close,
    attention_step,
    fill_paged_step,
    make_weight,
    poisoned,
    qk_transform,
    rand,
    rope_tables,
)
from tileinfer_backend_ref.dense import silu_mul as ref_silu_mul
from tileinfer_backend_ref.dense import xielu as ref_xielu
from tileinfer_backend_ref.kv import rope as ref_rope
from tileinfer_backend_ref.kv import store_kv as ref_store_kv


@pytest.fixture(scope="module")
def triton_ops():
    try:
        return get_backend("triton")
    except BackendError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def ref():
    return get_backend("ref")


@pytest.fixture(scope="module")
def device(triton_ops):
    return torch.device("cuda" if "cuda" in triton_ops.backend.info.devices else "cpu")


@pytest.fixture(scope="module")
def linear_mod(triton_ops):
    from tileinfer_backend_triton.kernels import linear

    return linear


# --- linear: every path ------------------------------------------------------------------------


def _linear_case(linear_mod, ref, device, m, k, n, int8, act, config):
    torch.manual_seed(m * 1000 + k + n)
    x = rand((m, k), torch.bfloat16, device)
    rows = 2 * n if act == linear_mod.ACT_SWIGLU else n
    w, scale = make_weight(rows, k, device, int8)
    out = poisoned((m, n), torch.bfloat16, device)
    expected = poisoned((m, n), torch.bfloat16, device)
    args = (0.0, 0.0, 0.0, 0.0) if act != linear_mod.ACT_XIELU else astuple(XIELU)
    linear_mod.launch_linear(out, x, w, scale, act=act, act_args=args, config=config)
    if act == linear_mod.ACT_SWIGLU:
        ref.linear_swiglu(expected, x, w, scale, poisoned((m, rows), torch.bfloat16, device))
    elif act == linear_mod.ACT_XIELU:
        ref.linear_xielu(expected, x, w, scale, XIELU)
    else:
        ref.linear(expected, x, w, scale)
    assert_close(out, expected)
    return out, (x, w, scale)


GEMV_CONFIGS = {  # name: (GemvConfig kwargs)
    "fma-split2": dict(block_n=32, block_k=64, split_k=2),
    "fma-split4-unroll": dict(block_n=16, block_k=32, split_k=4, unroll=2),
    "fma-nosplit-unroll": dict(block_n=64, block_k=64, split_k=1, unroll=2),
    "dot-split3": dict(block_n=32, block_k=64, split_k=3, dot=True),
    "dot-nosplit": dict(block_n=64, block_k=128, split_k=1, dot=True),
}


@pytest.mark.parametrize("cfg", list(GEMV_CONFIGS), ids=str)
@pytest.mark.parametrize("act", [0, 1, 2], ids=["linear", "swiglu", "xielu"])
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("m", [1, 5])
def test_gemv_paths(linear_mod, ref, device, m, int8, act, cfg):
    config = linear_mod.GemvConfig(**GEMV_CONFIGS[cfg])
    # K not a multiple of the tiles, N not a multiple of BLOCK_N.
    _linear_case(linear_mod, ref, device, m, 200, 72, int8, act, config)


def test_split_k_counters_rearm_between_launches(linear_mod, ref, device):
    """The last program of each tile resets its arrival counter: repeated launches (as a CUDA
    graph replays them) give the same, correct, bitwise-identical result."""
    config = linear_mod.GemvConfig(block_n=16, block_k=32, split_k=4)
    out1, (x, w, scale) = _linear_case(linear_mod, ref, device, 1, 256, 80, False, 0, config)
    for _ in range(3):
        again = poisoned(out1.shape, out1.dtype, device)
        linear_mod.launch_linear(again, x, w, scale, config=config)
        assert torch.equal(again, out1)
    _, locks = linear_mod.SCRATCH.get(device)
    assert int(locks[:16].abs().sum()) == 0


@pytest.mark.parametrize("act", [0, 1, 2], ids=["linear", "swiglu", "xielu"])
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_gemm_ragged_tiles(linear_mod, ref, device, int8, act):
    config = linear_mod.GemmConfig(block_m=32, block_n=32, block_k=32, group_m=2, num_warps=4,
                                   num_stages=2)
    _linear_case(linear_mod, ref, device, 45, 72, 50, int8, act, config)


def test_float32_model_linear_all_paths(triton_ops, ref, device):
    for m in (1, 3, 20):
        x = rand((m, 72), torch.float32, device)
        w = rand((40, 72), torch.float32, device, 0.1)
        out, expected = poisoned((m, 40), torch.float32, device), poisoned((m, 40), torch.float32, device)
        triton_ops.linear(out, x, w, None)
        ref.linear(expected, x, w, None)
        assert_close(out, expected, dtype=torch.float16)


# --- attention: split-KV on and off, odd groups and head sizes -----------------------------------


ATTN_EXTRA = [  # q_lens, context_lens, heads, kv_heads, head_dim, page_size
    ([1, 1], [300, 700], 14, 2, 64, 16),      # GQA group 7 (not a power of two)
    ([3], [200], 4, 2, 96, 16),               # head_dim 96 (padded to 128 in the kernel)
    ([2, 5], [513, 5], 8, 8, 64, 64),          # MHA, multi-token decode
    ([20, 1], [40, 600], 8, 2, 64, 16),        # a chunked-prefill step beside a decode
]


@pytest.mark.parametrize("splits,kind", [("none", "bf16"), ("auto", "bf16"), ("forced3", "bf16"),
                                         ("forced3", "int8-smooth")])
@pytest.mark.parametrize("case", ATTN_EXTRA, ids=lambda c: f"q{c[0]}-ctx{c[1]}-h{c[2]}/{c[3]}-d{c[4]}")
def test_attention_split_paths(triton_ops, ref, device, case, splits, kind):
    from tileinfer_backend_triton.kernels import attention

    q_lens, ctx_lens, heads, kv_heads, hd, page = case
    gen = torch.Generator().manual_seed(sum(ctx_lens))
    q, cache, cu, ctx, table = fill_paged_step(q_lens, ctx_lens, heads, kv_heads, hd, page, kind,
                                               device, gen)
    max_ctx = table.shape[1] * page
    for causal in (True, False):
        out, expected = poisoned(q.shape, q.dtype, device), poisoned(q.shape, q.dtype, device)
        ws = None if splits == "none" else triton_ops.attention_workspace(q.shape[0], heads, hd,
                                                                          max_ctx, q.device)
        attention.launch_attention(out, q, *cache.pools(), cu, ctx, table, max(q_lens), max_ctx,
                                   hd ** -0.5, causal, ws,
                                   splits=3 if splits == "forced3" else None)
        ref.attention(expected, q, cache.kv, attention_step(cu, ctx, table, max(q_lens), max_ctx),
                      hd ** -0.5, causal, None)
        assert_close(out, expected, what=f"causal={causal}")


def test_attention_float32_model(triton_ops, ref, device):
    """A float32 model: float32 queries and a float32 cache."""
    gen = torch.Generator().manual_seed(3)
    q, cache, cu, ctx, table = fill_paged_step([1, 6], [90, 30], 4, 2, 64, 16, "bf16", device, gen)
    q = q.float()
    cache.k, cache.v = cache.k.float(), cache.v.float()
    max_ctx = table.shape[1] * 16
    ws = triton_ops.attention_workspace(q.shape[0], 4, 64, max_ctx, q.device)
    out, expected = poisoned(q.shape, q.dtype, device), poisoned(q.shape, q.dtype, device)
    step = attention_step(cu, ctx, table, 6, max_ctx)
    triton_ops.attention(out, q, cache.kv, step, 0.125, True, ws)
    ref.attention(expected, q, cache.kv, step, 0.125, True, None)
    assert_close(out, expected, dtype=torch.float16)


def test_attention_inputs_head_dim_96(triton_ops, ref, device):
    n, heads, kv_heads, hd, page = 6, 6, 2, 96, 16
    cache = Cache(4, page, kv_heads, hd, "int8-smooth", device)
    expected = cache.clone()
    qkv = rand((n, (heads + 2 * kv_heads) * hd), torch.bfloat16, device)
    qk = qk_transform(hd, 64, device, qk_norm=True)
    pos = torch.arange(3, 3 + n, dtype=torch.int32).to(device)
    slots = torch.randperm(4 * page)[:n].to(device)
    table = torch.arange(4, dtype=torch.int32, device=device)[None]  # one sequence, pages 0..3
    step = attention_step(torch.tensor([0, n], dtype=torch.int32, device=device),
                          torch.tensor([3 + n], dtype=torch.int32, device=device), table, n,
                          3 + n, pos, slots)
    q_out, q_exp = poisoned((n, heads, hd), torch.bfloat16, device), poisoned((n, heads, hd), torch.bfloat16, device)
    triton_ops.attention_inputs(q_out, cache.kv, qkv, qk, step)
    ref.attention_inputs(q_exp, expected.kv, qkv, qk, step)
    assert_close(q_out, q_exp, what="queries")
    assert_cache_equal(cache, expected, slots, page)


# --- kernels behind no op: RoPE, the KV store, the standalone activations -----------------------


@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "qkv-view"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("n,heads,head_dim", [(1, 4, 64), (7, 3, 128), (20, 8, 64), (3, 2, 96)])
def test_rope_kernel(device, n, heads, head_dim, dtype, strided):
    from tileinfer_backend_triton.kernels import rope_kv

    torch.manual_seed(n + heads)
    cos, sin = rope_tables(512, head_dim, device)
    if strided:  # the query heads of a fused qkv row: (n, heads, head_dim) with a row stride
        x = rand((n, heads + 2, head_dim), dtype, device)[:, :heads]
    else:
        x = rand((n, heads, head_dim), dtype, device)
    positions = torch.randint(0, 512, (n,), dtype=torch.int32).to(device)
    out = poisoned((n, heads, head_dim), dtype, device)
    rope_kv.launch_rope(out, x, cos, sin, positions)
    assert_close(out, ref_rope(x, cos, sin, positions).to(dtype))


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("n,kv_heads,head_dim,page_size",
                         [(1, 2, 64, 16), (13, 1, 128, 16), (40, 8, 64, 64), (5, 3, 96, 16)])
def test_store_kv_kernel(device, kind, n, kv_heads, head_dim, page_size):
    from tileinfer_backend_triton.kernels import rope_kv

    torch.manual_seed(n + kv_heads)
    num_pages = 2 * n // page_size + 4
    cache = Cache(num_pages, page_size, kv_heads, head_dim, kind, device)
    expected = cache.clone()
    k = rand((n, kv_heads, head_dim), torch.bfloat16, device)
    v = rand((n, kv_heads, head_dim), torch.bfloat16, device)
    k[0] = 0  # an all-zero vector gets scale 1
    slots = torch.randperm(num_pages * page_size)[:n].to(device)
    rope_kv.launch_store_kv(*cache.pools(), k, v, slots)
    ref_store_kv(expected.kv, k, v, slots)
    assert_cache_equal(cache, expected, slots, page_size)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("n,inter", [(1, 64), (5, 300), (2, 2048)])
def test_silu_mul_kernel(device, dtype, n, inter):
    from tileinfer_backend_triton.kernels import activations

    torch.manual_seed(n + inter)
    gate_up = rand((n, 2 * inter), dtype, device, 2.0)
    out = poisoned((n, inter), dtype, device)
    activations.launch_silu_mul(out, gate_up)
    assert_close(out, ref_silu_mul(gate_up[:, :inter], gate_up[:, inter:], dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("shape", [(1, 64), (9, 333), (2, 3, 40)])
def test_xielu_kernel(device, dtype, shape):
    from tileinfer_backend_triton.kernels import activations

    torch.manual_seed(sum(shape))
    x = rand(shape, dtype, device, 3.0)
    out = poisoned(shape, dtype, device)
    activations.launch_xielu(out, x, *astuple(XIELU))
    assert_close(out, ref_xielu(x, XIELU).to(dtype))


# --- sampling: token-identical to the host definition -------------------------------------------

SEEDS = [0, 1234, -1, 2**40 + 17, -(2**62) + 5]
PARAMS = [SamplingParams(1.0), SamplingParams(0.7, top_k=20), SamplingParams(1.3, top_p=0.9),
          SamplingParams(0.8, top_k=50, top_p=0.8), SamplingParams(0.0)]


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_sample_tokens_match_sample_host_over_seeds(triton_ops, device, params):
    rows, vocab = 24, 2000
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(rows, vocab, generator=gen) * 2.5
    logits[:, 5] = logits[:, 6] = logits.max() + 1  # a tie at the top
    dev_logits = logits.to(device)
    for seed in SEEDS:
        counter = 2**33 + 7 if seed == -1 else 41  # a counter past 2**32 wraps as on the host
        out = poisoned((rows,), torch.int32, device)
        triton_ops.sample_tokens(out, dev_logits, params.temperature, params.top_k, params.top_p,
                                 torch.tensor([seed], device=device),
                                 torch.tensor([counter], device=device), None)
        host = [sample_host(logits[j], params, seed, counter + j) for j in range(rows)]
        assert out.cpu().tolist() == host, f"seed {seed}"


@pytest.mark.parametrize("params", PARAMS[:4] + [SamplingParams(0.0)], ids=str)
def test_accept_tokens_match_accept_host_over_seeds(triton_ops, device, params):
    rows, vocab = 16, 700
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(rows, vocab, generator=gen) * 2
    q = torch.softmax(logits + torch.randn(rows, vocab, generator=gen), -1)
    drafts = torch.multinomial(q, 1, generator=gen)[:, 0].to(torch.int32)
    for seed in SEEDS[:3]:
        for draft_probs in (None, q):
            out = poisoned((rows,), torch.int32, device)
            triton_ops.accept_tokens(out, logits.to(device), drafts.to(device),
                                     None if draft_probs is None else draft_probs.to(device),
                                     params.temperature, params.top_k, params.top_p,
                                     torch.tensor([seed], device=device),
                                     torch.tensor([3], device=device))
            host = [accept_host(logits[j], int(drafts[j]),
                                None if draft_probs is None else draft_probs[j], params, seed, 3 + j)
                    for j in range(rows)]
            assert out.cpu().tolist() == host, f"seed {seed}, q {'given' if draft_probs is not None else 'one-hot'}"


def test_sampled_tokens_follow_the_filtered_distribution(triton_ops, device):
    """Many counters of one row: the empirical frequencies match softmax(top-k filtered)."""
    vocab, draws = 64, 1024
    logits = torch.linspace(-2, 2, vocab)
    rows = logits[None].repeat(draws, 1).to(device)
    out = poisoned((draws,), torch.int32, device)
    triton_ops.sample_tokens(out, rows, 1.0, 8, 1.0, torch.tensor([9], device=device),
                             torch.tensor([0], device=device), None)
    counts = torch.bincount(out.cpu().long(), minlength=vocab).float()
    assert counts[: vocab - 8].sum() == 0
    expect = torch.softmax(logits[vocab - 8:], 0) * draws
    chi2 = float(((counts[vocab - 8:] - expect) ** 2 / expect).sum())
    assert chi2 < 30, chi2  # 7 degrees of freedom: p ~ 1e-4
