"""Conformance tests: each op of a backend against the ref backend on the same random inputs.

Outputs are poisoned (NaN, or a sentinel for integers) before each call, so an element the
backend fails to write fails the comparison. Tolerances are per dtype: bf16 results may differ by
about one rounding (relative 2**-7) from float32 accumulation in another order; INT8 cache values
by one quantization step.
"""

from __future__ import annotations

import math

import pytest
import torch

from tileinfer.backend.registry import get_backend
from tileinfer.backend.sampling import SamplingParams

TOLERANCE = {  # dtype: (atol, rtol)
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (2e-3, 2e-3),
}
INT_POISON = -7777
INT8_POISON = -128  # never written: INT8 values are clamped to [-127, 127]


# --- helpers -------------------------------------------------------------------------------------


@pytest.fixture
def ops(backend_name):
    return get_backend(backend_name)


@pytest.fixture
def ref():
    return get_backend("ref")


@pytest.fixture
def device(ops):
    devices = ops.backend.info.devices
    if "cuda" in devices and torch.cuda.is_available():
        return torch.device("cuda")
    if "cpu" in devices:
        return torch.device("cpu")
    pytest.skip(f"backend {ops.name!r} runs on {devices}, not available here")


def poisoned(shape, dtype, device):
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, INT8_POISON if dtype == torch.int8 else INT_POISON, dtype=dtype,
                      device=device)


def assert_close(actual, expected, dtype=None, what="output"):
    dtype = dtype or expected.dtype
    atol, rtol = TOLERANCE[dtype]
    a, e = actual.float().cpu(), expected.float().cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    assert not a.isnan().any(), f"{what}: {int(a.isnan().sum())} elements unwritten (NaN)"
    bad = (a - e).abs() > atol + rtol * e.abs()
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements differ beyond atol={atol} rtol={rtol};"
            f" first at {idx}: {a[idx].item()} vs ref {e[idx].item()},"
            f" max abs err {(a - e).abs().max().item():.4g}")


def rand(shape, dtype, device, scale=1.0, gen=None):
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)


def quantize_weight(w):
    """Symmetric per-output-channel INT8 (the same rule as tileinfer.quant)."""
    amax = w.float().abs().amax(1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.clamp(torch.round(w.float() / scale[:, None]), -127, 127).to(torch.int8)
    return q, scale


# --- elementwise and norms -----------------------------------------------------------------------

DTYPES = [torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,vocab,hidden", [(1, 100, 64), (7, 333, 96), (33, 1000, 520)])
def test_embed(ops, ref, device, dtype, n, vocab, hidden):
    table = rand((vocab, hidden), dtype, device)
    ids = torch.randint(0, vocab, (n,), dtype=torch.int32).to(device)
    out = poisoned((n, hidden), dtype, device)
    ops.embed(out, table, ids)
    assert torch.equal(out.cpu(), table[ids.long()].cpu()), "embed must copy rows exactly"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (5, 96), (3, 2048), (17, 4, 64), (2, 7, 128), (3, 576)])
def test_rmsnorm(ops, ref, device, dtype, shape):
    x = rand(shape, dtype, device, 3.0)
    w = rand(shape[-1:], dtype, device) + 1
    out, expected = poisoned(shape, dtype, device), poisoned(shape, dtype, device)
    ops.rmsnorm(out, x, w, 1e-5)
    ref.rmsnorm(expected, x, w, 1e-5)
    assert_close(out, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,hidden", [(1, 64), (6, 200), (4, 4096)])
def test_add_rmsnorm(ops, ref, device, dtype, n, hidden):
    res, delta = rand((n, hidden), dtype, device), rand((n, hidden), dtype, device)
    w = rand((hidden,), dtype, device) + 1
    res_a, res_e = res.clone(), res.clone()
    out, expected = poisoned((n, hidden), dtype, device), poisoned((n, hidden), dtype, device)
    ops.add_rmsnorm(res_a, out, delta, w, 1e-6)
    ref.add_rmsnorm(res_e, expected, delta, w, 1e-6)
    assert_close(res_a, res_e, what="residual")
    assert_close(out, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,inter", [(1, 64), (5, 300), (2, 2048)])
def test_silu_mul(ops, ref, device, dtype, n, inter):
    gate_up = rand((n, 2 * inter), dtype, device, 2.0)
    out, expected = poisoned((n, inter), dtype, device), poisoned((n, inter), dtype, device)
    ops.silu_mul(out, gate_up)
    ref.silu_mul(expected, gate_up)
    assert_close(out, expected)


# Apertus-like effective xIELU scalars (alpha_p, alpha_n, beta, eps).
XIELU = (0.8, 0.9, 0.5, -1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,dim", [(1, 64), (9, 333)])
def test_xielu(ops, ref, device, dtype, n, dim):
    x = rand((n, dim), dtype, device, 3.0)
    out, expected = poisoned((n, dim), dtype, device), poisoned((n, dim), dtype, device)
    ops.xielu(out, x, *XIELU)
    ref.xielu(expected, x, *XIELU)
    assert_close(out, expected)


def rope_tables(max_len, head_dim, device, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,heads,head_dim", [(1, 4, 64), (7, 3, 128), (20, 8, 64)])
def test_rope(ops, ref, device, dtype, n, heads, head_dim):
    cos, sin = rope_tables(512, head_dim, device)
    x = rand((n, heads, head_dim), dtype, device)
    positions = torch.randint(0, 512, (n,), dtype=torch.int32).to(device)
    out, expected = poisoned(x.shape, dtype, device), poisoned(x.shape, dtype, device)
    ops.rope(out, x, cos, sin, positions)
    ref.rope(expected, x, cos, sin, positions)
    assert_close(out, expected)


# --- linear layers -------------------------------------------------------------------------------

LINEAR_SHAPES = [(1, 64, 96), (3, 136, 200), (8, 256, 512), (17, 96, 64), (64, 256, 384),
                 (1, 576, 1536), (5, 1536, 576)]  # SmolLM2-135M's hidden 576 / intermediate 1536


def make_weight(out_f, in_f, device, int8):
    w = rand((out_f, in_f), torch.bfloat16, device, 0.05)
    if int8:
        q, scale = quantize_weight(w)
        return q.to(device), scale.to(device)
    return w, None


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,in_f,out_f", LINEAR_SHAPES)
def test_linear(ops, ref, device, int8, out_dtype, n, in_f, out_f):
    x = rand((n, in_f), torch.bfloat16, device)
    w, scale = make_weight(out_f, in_f, device, int8)
    out, expected = poisoned((n, out_f), out_dtype, device), poisoned((n, out_f), out_dtype, device)
    ops.linear(out, x, w, scale)
    ref.linear(expected, x, w, scale)
    # A float32 output of a bf16 product still carries the inputs' rounding: bf16 tolerance.
    assert_close(out, expected, dtype=torch.bfloat16)
    if not int8 and out_dtype == torch.float32:  # the product is rounded to x's dtype first
        assert torch.equal(out, out.to(torch.bfloat16).float()), "float32 out not bf16-rounded"


def test_linear_float32_model(ops, ref, device):
    x = rand((5, 72), torch.float32, device)
    w = rand((40, 72), torch.float32, device, 0.1)
    out, expected = poisoned((5, 40), torch.float32, device), poisoned((5, 40), torch.float32, device)
    ops.linear(out, x, w, None)
    ref.linear(expected, x, w, None)
    assert_close(out, expected, dtype=torch.float16)  # TF32 or reordered sums: a little looser


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("n,in_f,inter", [(1, 64, 96), (4, 136, 200), (37, 128, 256)])
def test_linear_swiglu(ops, ref, device, int8, n, in_f, inter):
    x = rand((n, in_f), torch.bfloat16, device)
    w, scale = make_weight(2 * inter, in_f, device, int8)
    out, expected = poisoned((n, inter), torch.bfloat16, device), poisoned((n, inter), torch.bfloat16, device)
    scratch = poisoned((n, 2 * inter), torch.bfloat16, device)
    ops.linear_swiglu(out, x, w, scale, scratch)
    ref.linear_swiglu(expected, x, w, scale, scratch.clone())
    assert_close(out, expected)


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("n,in_f,inter", [(1, 64, 96), (4, 136, 200), (37, 128, 256)])
def test_linear_xielu(ops, ref, device, int8, n, in_f, inter):
    x = rand((n, in_f), torch.bfloat16, device)
    w, scale = make_weight(inter, in_f, device, int8)
    out, expected = poisoned((n, inter), torch.bfloat16, device), poisoned((n, inter), torch.bfloat16, device)
    ops.linear_xielu(out, x, w, scale, *XIELU)
    ref.linear_xielu(expected, x, w, scale, *XIELU)
    assert_close(out, expected)


# --- KV cache ------------------------------------------------------------------------------------


class Cache:
    """One layer's page pools (bf16, int8, or int8 with key smoothing), poisoned."""

    def __init__(self, num_pages, page_size, kv_heads, head_dim, kind, device):
        shape = (num_pages, page_size, kv_heads, head_dim)
        if kind == "bf16":
            self.k, self.v = poisoned(shape, torch.bfloat16, device), poisoned(shape, torch.bfloat16, device)
            self.k_scale = self.v_scale = self.k_smooth = None
        else:
            self.k, self.v = poisoned(shape, torch.int8, device), poisoned(shape, torch.int8, device)
            sshape = shape[:3]
            self.k_scale = poisoned(sshape, torch.float32, device)
            self.v_scale = poisoned(sshape, torch.float32, device)
            self.k_smooth = None
            if kind == "int8-smooth":
                self.k_smooth = (torch.rand(kv_heads, head_dim) * 3 + 0.25).to(device)

    def pools(self):
        return self.k, self.v, self.k_scale, self.v_scale, self.k_smooth

    def clone(self):
        c = object.__new__(Cache)
        for name in ("k", "v", "k_scale", "v_scale", "k_smooth"):
            t = getattr(self, name)
            setattr(c, name, None if t is None else t.clone())
        return c


def assert_cache_equal(actual, expected, slots, page_size):
    """Compare the written slots: bf16 values, or int8 values within one step and scales."""
    page, offset = (slots // page_size).cpu(), (slots % page_size).cpu()
    for name in ("k", "v"):
        a, e = getattr(actual, name).cpu()[page, offset], getattr(expected, name).cpu()[page, offset]
        if a.dtype == torch.int8:
            diff = (a.int() - e.int()).abs()
            assert int(diff.max()) <= 1, f"{name} cache: int8 values differ by {int(diff.max())}"
            assert_close(getattr(actual, name + "_scale")[page, offset],
                         getattr(expected, name + "_scale")[page, offset], torch.float16,
                         what=f"{name} scales")
        else:
            assert_close(a, e, what=f"{name} cache")


CACHE_KINDS = ["bf16", "int8", "int8-smooth"]


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("n,kv_heads,head_dim,page_size", [(1, 2, 64, 16), (13, 1, 128, 16), (40, 8, 64, 64)])
def test_store_kv(ops, ref, device, kind, n, kv_heads, head_dim, page_size):
    num_pages = 2 * n // page_size + 4
    cache = Cache(num_pages, page_size, kv_heads, head_dim, kind, device)
    expected = cache.clone()
    k, v = rand((n, kv_heads, head_dim), torch.bfloat16, device), rand((n, kv_heads, head_dim), torch.bfloat16, device)
    k[0] = 0  # an all-zero vector gets scale 1
    slots = torch.randperm(num_pages * page_size)[:n].to(device)
    ops.store_kv(*cache.pools(), k, v, slots)
    ref.store_kv(*expected.pools(), k, v, slots)
    assert_cache_equal(cache, expected, slots, page_size)


ATTN_INPUT_SHAPES = [  # n, heads, kv_heads, head_dim
    (1, 4, 4, 64), (5, 8, 2, 128), (19, 8, 1, 64),
    (3, 9, 3, 64),  # GQA 3 (SmolLM2-135M)
]


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qknorm"])
@pytest.mark.parametrize("n,heads,kv_heads,head_dim", ATTN_INPUT_SHAPES)
def test_attention_inputs(ops, ref, device, kind, qk_norm, n, heads, kv_heads, head_dim):
    page_size = 16
    num_pages = n // page_size + 4
    cache = Cache(num_pages, page_size, kv_heads, head_dim, kind, device)
    expected = cache.clone()
    qkv = rand((n, (heads + 2 * kv_heads) * head_dim), torch.bfloat16, device)
    q_norm = k_norm = None
    if qk_norm:
        q_norm, k_norm = rand((head_dim,), torch.bfloat16, device) + 1, rand((head_dim,), torch.bfloat16, device) + 1
    cos, sin = rope_tables(256, head_dim, device)
    positions = torch.arange(7, 7 + n, dtype=torch.int32).to(device)
    slots = torch.randperm(num_pages * page_size)[:n].to(device)
    q_out = poisoned((n, heads, head_dim), torch.bfloat16, device)
    q_exp = poisoned((n, heads, head_dim), torch.bfloat16, device)
    ops.attention_inputs(q_out, *cache.pools(), qkv, q_norm, k_norm, cos, sin, positions, slots, 1e-6)
    ref.attention_inputs(q_exp, *expected.pools(), qkv, q_norm, k_norm, cos, sin, positions, slots, 1e-6)
    assert_close(q_out, q_exp, what="queries")
    assert_cache_equal(cache, expected, slots, page_size)


# --- attention -----------------------------------------------------------------------------------


def fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim, page_size, kind, device, gen):
    """A step of several sequences with their context already in (shuffled) pages.

    Returns q, the cache and the step metadata; pages of different sequences interleave and the
    block table is padded with a page index past the used ones (never to be read).
    """
    pages_per_seq = [math.ceil(c / page_size) for c in context_lens]
    num_pages = sum(pages_per_seq) + 3
    max_pages = max(pages_per_seq) + 2
    perm = torch.randperm(num_pages - 1, generator=gen)
    block_table = torch.full((len(context_lens), max_pages), num_pages - 1, dtype=torch.int32)
    cache = Cache(num_pages, page_size, kv_heads, head_dim, kind, "cpu")
    used = 0
    for b, ctx in enumerate(context_lens):
        block_table[b, : pages_per_seq[b]] = perm[used: used + pages_per_seq[b]]
        used += pages_per_seq[b]
        k = rand((ctx, kv_heads, head_dim), torch.bfloat16, "cpu", 1.0, gen)
        v = rand((ctx, kv_heads, head_dim), torch.bfloat16, "cpu", 1.0, gen)
        pos = torch.arange(ctx)
        slots = block_table[b, pos // page_size].long() * page_size + pos % page_size
        get_backend("ref").store_kv(*cache.pools(), k, v, slots)
    # Fill the unused pages (padding page included) with large garbage: reading them shows.
    for name in ("k", "v"):
        pool = getattr(cache, name)
        unused = torch.ones(num_pages, dtype=torch.bool)
        unused[block_table.flatten().long()] = False
        unused[num_pages - 1] = True
        pool[unused] = 100
        if getattr(cache, name + "_scale") is not None:
            getattr(cache, name + "_scale")[unused] = 1e4
    for name in ("k", "v", "k_scale", "v_scale", "k_smooth"):
        t = getattr(cache, name)
        if t is not None:
            setattr(cache, name, t.to(device))
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    q = rand((int(cu[-1]), heads, head_dim), torch.bfloat16, device, 1.0, gen)
    ctx_t = torch.tensor(context_lens, dtype=torch.int32)
    return q, cache, cu.to(device), ctx_t.to(device), block_table.to(device)


ATTENTION_CASES = [  # q_lens, context_lens, heads, kv_heads, head_dim, page_size
    ([1], [1], 4, 4, 64, 16),                      # first token
    ([1], [77], 8, 1, 128, 16),                    # decode, GQA 8
    ([1, 1, 1], [5, 300, 129], 8, 2, 64, 16),      # batched decode, GQA 4
    ([4], [40], 4, 4, 64, 64),                     # a speculative verify step
    ([37], [37], 8, 2, 64, 16),                    # prefill
    ([9, 1, 30], [25, 64, 30], 4, 1, 128, 16),     # mixed prefill / decode, GQA 4
    ([1], [1100], 8, 1, 64, 16),                   # long context (split-KV)
    ([1], [45], 9, 3, 64, 16),                     # GQA 3 (SmolLM2-135M), decode
    ([37], [37], 9, 3, 64, 16),                    # GQA 3, prefill
    ([4, 1], [300, 70], 9, 3, 64, 16),             # GQA 3, verify + decode
]


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "block"])
@pytest.mark.parametrize("case", ATTENTION_CASES, ids=lambda c: f"q{c[0]}-ctx{c[1]}-h{c[2]}/{c[3]}-d{c[4]}-p{c[5]}")
def test_attention(ops, ref, device, kind, causal, case):
    q_lens, context_lens, heads, kv_heads, head_dim, page_size = case
    gen = torch.Generator().manual_seed(sum(context_lens) + heads)
    q, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, device, gen)
    scale = head_dim ** -0.5
    max_q, max_ctx = max(q_lens), table.shape[1] * page_size
    out, expected = poisoned(q.shape, q.dtype, device), poisoned(q.shape, q.dtype, device)
    ws = ops.attention_workspace(q.shape[0], heads, head_dim, max_ctx, q.device)
    ops.attention(out, q, *cache.pools(), cu, ctx, table, max_q, max_ctx, scale, causal, ws)
    ref.attention(expected, q, *cache.pools(), cu, ctx, table, max_q, max_ctx, scale, causal, None)
    assert_close(out, expected)


def decode_step_inputs(q_lens, context_lens, table, heads, kv_heads, head_dim, page_size, device,
                       gen):
    """qkv and the positions / slots of a step whose sequence b has q_lens[b] new tokens at the
    end of its context_lens[b] positions (pages from the block table)."""
    positions, slots = [], []
    for b, (n, ctx) in enumerate(zip(q_lens, context_lens)):
        for pos in range(ctx - n, ctx):
            positions.append(pos)
            slots.append(int(table[b, pos // page_size]) * page_size + pos % page_size)
    qkv = rand((len(positions), (heads + 2 * kv_heads) * head_dim), torch.bfloat16, device, 1.0, gen)
    return (qkv, torch.tensor(positions, dtype=torch.int32, device=device),
            torch.tensor(slots, dtype=torch.int64, device=device))


ATTENTION_WITH_INPUTS_CASES = [  # q_lens, context_lens, heads, kv_heads, head_dim, page_size
    ([1], [1], 4, 4, 64, 16),                      # first token
    ([1], [77], 8, 1, 128, 16),                    # decode, GQA 8
    ([1, 1, 1], [5, 300, 129], 8, 2, 64, 16),      # batched decode
    ([1], [1100], 8, 2, 128, 16),                  # long context: the new key in the last split
    ([4, 1], [300, 70], 9, 3, 64, 16),             # a verify step beside a decode row
]


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qknorm"])
@pytest.mark.parametrize("case", ATTENTION_WITH_INPUTS_CASES,
                         ids=lambda c: f"q{c[0]}-ctx{c[1]}-h{c[2]}/{c[3]}-d{c[4]}")
def test_attention_with_inputs(ops, ref, device, kind, qk_norm, case):
    q_lens, context_lens, heads, kv_heads, head_dim, page_size = case
    gen = torch.Generator().manual_seed(sum(context_lens) + 7)
    _, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, device, gen)
    expected = cache.clone()
    qkv, positions, slots = decode_step_inputs(q_lens, context_lens, table.cpu(), heads, kv_heads,
                                               head_dim, page_size, device, gen)
    q_norm = k_norm = None
    if qk_norm:
        q_norm, k_norm = rand((head_dim,), torch.bfloat16, device) + 1, rand((head_dim,), torch.bfloat16, device) + 1
    cos, sin = rope_tables(2048, head_dim, device)
    n = qkv.shape[0]
    scale = head_dim ** -0.5
    max_q, max_ctx = max(q_lens), table.shape[1] * page_size
    out, out_exp = poisoned((n, heads, head_dim), torch.bfloat16, device), poisoned((n, heads, head_dim), torch.bfloat16, device)
    ws = ops.attention_workspace(n, heads, head_dim, max_ctx, device)
    inputs = (qkv, q_norm, k_norm, cos, sin, positions, slots, 1e-6, cu, ctx, table, max_q, max_ctx,
              scale, True)
    ops.attention_with_inputs(out, poisoned(out.shape, torch.bfloat16, device), *cache.pools(),
                              *inputs, ws)
    ref.attention_with_inputs(out_exp, poisoned(out.shape, torch.bfloat16, device),
                              *expected.pools(), *inputs, None)
    assert_cache_equal(cache, expected, slots, page_size)
    assert_close(out, out_exp)


# --- sampling ------------------------------------------------------------------------------------

SAMPLING = [
    SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7, top_k=20),
    SamplingParams(1.3, top_p=0.9), SamplingParams(0.8, top_k=50, top_p=0.8),
    SamplingParams(1.0, top_k=1),
]


def _seed_counter(device, seed=1234, counter=5):
    return (torch.tensor([seed], dtype=torch.int64, device=device),
            torch.tensor([counter], dtype=torch.int64, device=device))


@pytest.mark.parametrize("params", SAMPLING, ids=str)
@pytest.mark.parametrize("n,vocab", [(1, 1000), (5, 3001), (2, 50000)])
def test_sample_tokens(ops, ref, device, params, n, vocab):
    logits = (torch.randn(n, vocab) * 3).to(device)
    logits[0, 7] = logits[0, 8] = logits[0].max() + 1  # a tie: the lower index wins when greedy
    seed, counter = _seed_counter(device)
    out, expected = poisoned((n,), torch.int32, device), poisoned((n,), torch.int32, device)
    probs, probs_exp = poisoned((n, vocab), torch.float32, device), poisoned((n, vocab), torch.float32, device)
    ops.sample_tokens(out, logits, params.temperature, params.top_k, params.top_p, seed, counter, probs)
    ref.sample_tokens(expected, logits, params.temperature, params.top_k, params.top_p, seed, counter, probs_exp)
    assert out.cpu().tolist() == expected.cpu().tolist()
    assert_close(probs, probs_exp, torch.float16, what="filtered probabilities")
    # Without probs_out the same tokens come out.
    again = poisoned((n,), torch.int32, device)
    ops.sample_tokens(again, logits, params.temperature, params.top_k, params.top_p, seed, counter, None)
    assert again.cpu().tolist() == expected.cpu().tolist()


@pytest.mark.parametrize("params", SAMPLING[1:], ids=str)
@pytest.mark.parametrize("with_q", [False, True], ids=["onehot-q", "draft-q"])
def test_accept_tokens(ops, ref, device, params, with_q):
    n, vocab = 64, 500
    gen = torch.Generator().manual_seed(7)
    logits = (torch.randn(n, vocab, generator=gen) * 2).to(device)
    draft_logits = logits.cpu() + torch.randn(n, vocab, generator=gen)
    q = torch.softmax(draft_logits, -1).to(device) if with_q else None
    drafts = torch.multinomial(torch.softmax(draft_logits, -1), 1, generator=gen)[:, 0]
    drafts = drafts.to(torch.int32).to(device)
    seed, counter = _seed_counter(device, 99, 0)
    out, expected = poisoned((n,), torch.int32, device), poisoned((n,), torch.int32, device)
    ops.accept_tokens(out, logits, drafts, q, params.temperature, params.top_k, params.top_p, seed, counter)
    ref.accept_tokens(expected, logits, drafts, q, params.temperature, params.top_k, params.top_p, seed, counter)
    assert out.cpu().tolist() == expected.cpu().tolist()
