"""Fixtures and helpers of the conformance suite: poisoned outputs, tolerances, random inputs,
paged KV caches and attention steps.

Outputs are poisoned (NaN, or a sentinel for integers) before each call, so an element the
backend fails to write fails the comparison. Tolerances are per dtype: bf16 results may differ by
about one rounding (relative 2**-7) from float32 accumulation in another order; INT8 cache values
by one quantization step; float32 sums of bf16 products (the logits) only by the summation order
(``assert_float32_sums_close``).

Other backends' own tests import these helpers too (``fill_paged_step``, ``Cache``, ...). The
fixtures (``ops``, ``ref``, ``device``) are in ``conftest``.
"""

from __future__ import annotations

import math

import pytest

import torch

from tileinfer.backend.fp8 import e4m3_values, quantize_rows
from tileinfer.backend.sampling import SamplingParams
from tileinfer.backend.types import AttentionStep, LayerKV, QKTransform, XIELUScalars

TOLERANCE = {  # dtype: (atol, rtol)
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (2e-2, 2e-2),
    torch.float16: (2e-3, 2e-3),
}
INT_POISON = -7777
INT8_POISON = -128  # never written: INT8 values are clamped to [-127, 127]
DTYPES = [torch.bfloat16, torch.float32]


# --- tensors -------------------------------------------------------------------------------------


def poisoned(shape, dtype, device):
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, INT8_POISON if dtype == torch.int8 else INT_POISON, dtype=dtype,
                      device=device)


def run_linear_op(ops, op, x, weight, weight_scale, out_features, batch_invariant):
    """The bf16 output (n, out_features) of ``ops``' linear op ``op`` ("linear",
    "linear_swiglu" with a scratch of 2 out_features, or "linear_xielu" with XIELU), into
    NaN-poisoned tensors (an output the op leaves unwritten stays NaN)."""
    n = x.shape[0]
    out = poisoned((n, out_features), torch.bfloat16, x.device)
    if op == "linear_swiglu":
        gate_up = poisoned((n, 2 * out_features), torch.bfloat16, x.device)
        ops.linear_swiglu(out, x, weight, weight_scale, gate_up, batch_invariant)
    elif op == "linear_xielu":
        ops.linear_xielu(out, x, weight, weight_scale, XIELU, batch_invariant)
    else:
        ops.linear(out, x, weight, weight_scale, batch_invariant)
    return out


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


# A float32 sum of K products, summed in another order (split-K, tensor-core tiles), differs from
# ref's by a few float32 roundings of the partial sums: far below 2**-14 of the sum of the
# products' magnitudes. Rounding the sum to bf16 instead (relative 2**-9) exceeds it for most
# elements.
FLOAT32_SUM_RTOL = 2.0 ** -14


def assert_float32_sums_close(actual, expected, x, weight, weight_scale=None, what="output"):
    """actual == expected (n, out) up to the summation order of float32 sums of
    ``x @ W.T``: elementwise within FLOAT32_SUM_RTOL of ``|x| @ |W|.T``."""
    w = (e4m3_values(weight) if weight.dtype == torch.uint8 else weight.float()).abs()
    if weight_scale is not None:
        w = w * weight_scale.float().abs()[:, None]
    bound = (x.float().abs() @ w.T).cpu() * FLOAT32_SUM_RTOL + 1e-6
    a, e = actual.float().cpu(), expected.float().cpu()
    assert a.shape == e.shape, f"{what}: shape {tuple(a.shape)} != {tuple(e.shape)}"
    assert not a.isnan().any(), f"{what}: {int(a.isnan().sum())} elements unwritten (NaN)"
    err = (a - e).abs()
    bad = err > bound
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{bad.numel()} elements differ from the float32 sums by more "
            f"than {FLOAT32_SUM_RTOL:.3g} of |x| @ |W|.T; first at {idx}: {a[idx].item()!r} vs ref "
            f"{e[idx].item()!r} (a float32 out is the unrounded sum: rounded to bf16?)")


def rand(shape, dtype, device, scale=1.0, gen=None):
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)


def quantize_weight(w):
    """Symmetric per-output-channel INT8 (the same rule as tileinfer.model.quant)."""
    amax = w.float().abs().amax(1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.clamp(torch.round(w.float() / scale[:, None]), -127, 127).to(torch.int8)
    return q, scale


def make_weight(out_f, in_f, device, int8):
    w = rand((out_f, in_f), torch.bfloat16, device, 0.05)
    if int8:
        q, scale = quantize_weight(w)
        return q.to(device), scale.to(device)
    return w, None


# The linear ops' weight kinds: bf16, int8 with row scales, and e4m3 bits (uint8) with row scales
# (the weight-only FP8 product: only for a backend that declares BackendInfo.fp8_weight_only).
WEIGHT_KINDS = ["bf16", "int8", "e4m3"]


# Every e4m3 bit pattern but the two NaN codes (0x7F, 0xFF), subnormals and -0 included.
FINITE_E4M3_CODES = [c for c in range(256) if c & 0x7F != 0x7F]


def skip_without_fp8_weight_only(ops):
    if not ops.backend.info.fp8_weight_only:
        pytest.skip(f"backend {ops.name!r} does not declare fp8_weight_only linear ops")


def make_weight_of(kind, out_f, in_f, device, ops):
    """(weight, scale) of a WEIGHT_KINDS kind for ops; skips e4m3 for a backend without it."""
    if kind == "e4m3":
        skip_without_fp8_weight_only(ops)
        q, scale = make_fp8_weight(out_f, in_f, device)
        return q.view(torch.uint8), scale
    return make_weight(out_f, in_f, device, kind == "int8")


def make_fp8_weight(out_f, in_f, device, gen=None):
    """An e4m3 weight with per-row scales (the rule of tileinfer.model.quant.quantize_fp8)."""
    q, scale = quantize_rows(rand((out_f, in_f), torch.bfloat16, "cpu", 0.05, gen))
    return q.to(device), scale.to(device)


# Apertus-like effective xIELU scalars.
XIELU = XIELUScalars(alpha_p=0.8, alpha_n=0.9, beta=0.5, eps=-1e-6)


def rope_tables(max_len, head_dim, device, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(max_len, dtype=torch.float64)[:, None] * inv[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


def qk_transform(head_dim, max_len, device, qk_norm, gen=None):
    """A ``QKTransform``: RoPE tables, and random q/k norm weights if qk_norm."""
    cos, sin = rope_tables(max_len, head_dim, device)
    q_norm = k_norm = None
    if qk_norm:
        q_norm = rand((head_dim,), torch.bfloat16, device, 1.0, gen) + 1
        k_norm = rand((head_dim,), torch.bfloat16, device, 1.0, gen) + 1
    return QKTransform(cos, sin, q_norm, k_norm, 1e-6)


# --- KV cache and steps --------------------------------------------------------------------------

CACHE_KINDS = ["bf16", "int8", "int8-smooth"]


class Cache:
    """One layer's page pools (bf16, int8, or int8 with key smoothing), poisoned."""

    def __init__(self, num_pages, page_size, kv_heads, head_dim, kind, device):
        shape = (num_pages, page_size, kv_heads, head_dim)
        self.k_scale = self.v_scale = self.k_smooth = None
        if kind == "bf16":
            self.k, self.v = poisoned(shape, torch.bfloat16, device), poisoned(shape, torch.bfloat16, device)
        else:
            self.k, self.v = poisoned(shape, torch.int8, device), poisoned(shape, torch.int8, device)
            self.k_scale = poisoned(shape[:3], torch.float32, device)
            self.v_scale = poisoned(shape[:3], torch.float32, device)
            if kind == "int8-smooth":
                self.k_smooth = (torch.rand(kv_heads, head_dim) * 3 + 0.25).to(device)

    @property
    def kv(self) -> LayerKV:
        """The pools as the ops take them (built from the current attributes)."""
        return LayerKV(self.k, self.v, self.k_scale, self.v_scale, self.k_smooth)

    def pools(self):
        return self.k, self.v, self.k_scale, self.v_scale, self.k_smooth

    def clone(self):
        c = object.__new__(Cache)
        for name in ("k", "v", "k_scale", "v_scale", "k_smooth"):
            t = getattr(self, name)
            setattr(c, name, None if t is None else t.clone())
        return c


def write_pages(cache: Cache, k, v, slots):
    """Put keys and values (n, kv_heads, head_dim) at slots: copied, or per-vector INT8 (keys
    divided by the smoothing factors first). Test setup only; what a backend writes is checked
    through ``attention_inputs``."""
    page_size = cache.k.shape[1]
    page, offset = slots // page_size, slots % page_size
    for pool, scales, vec in ((cache.k, cache.k_scale, k), (cache.v, cache.v_scale, v)):
        if scales is None:
            pool[page, offset] = vec.to(pool.dtype)
            continue
        vec = vec.float()
        if pool is cache.k and cache.k_smooth is not None:
            vec = vec / cache.k_smooth.to(vec.device)
        amax = vec.abs().amax(-1)
        scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
        pool[page, offset] = torch.clamp(torch.round(vec / scale[..., None]), -127, 127).to(torch.int8)
        scales[page, offset] = scale


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


def attention_step(cu, ctx, table, max_query_len, max_context_len, positions=None, slots=None):
    """An ``AttentionStep``; positions and slots (which attention does not read) default to
    empty tensors."""
    if positions is None:
        positions = torch.empty(0, dtype=torch.int32, device=cu.device)
    if slots is None:
        slots = torch.empty(0, dtype=torch.int64, device=cu.device)
    return AttentionStep(positions, slots, cu, ctx, table, int(max_query_len), int(max_context_len))


def fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim, page_size, kind, device, gen):
    """A step of several sequences with their context already in (shuffled) pages.

    Returns q, the cache, cu_seqlens_q, context_lens and the block table; pages of different
    sequences interleave and the block table is padded with a page index past the used ones
    (never to be read).
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
        write_pages(cache, k, v, block_table[b, pos // page_size].long() * page_size + pos % page_size)
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

WINDOW_CASES = [  # q_lens, context_lens, heads, kv_heads, head_dim, page_size, window
    ([1], [77], 8, 1, 128, 16, 16),                # decode far past the window
    ([37], [37], 8, 2, 64, 16, 8),                 # prefill: the window slides over it
    ([9, 1, 30], [25, 64, 30], 4, 1, 128, 16, 20),  # mixed prefill / decode
    ([4, 1], [300, 70], 9, 3, 64, 16, 512),         # a window longer than the context
    ([1], [1100], 8, 1, 64, 16, 1),                # window 1: its own position only
    ([3, 1, 2], [90, 33, 18], 4, 1, 64, 16, 21),   # verify rows, a window across pages
    ([20, 1, 15], [200, 150, 15], 4, 1, 64, 16, 24),  # a chunk, decode, prefill: past the window
]

SAMPLING = [
    SamplingParams(0.0), SamplingParams(1.0), SamplingParams(0.7, top_k=20),
    SamplingParams(1.3, top_p=0.9), SamplingParams(0.8, top_k=50, top_p=0.8),
    SamplingParams(1.0, top_k=1),
]


def seed_counter(device, seed=1234, counter=5):
    return (torch.tensor([seed], dtype=torch.int64, device=device),
            torch.tensor([counter], dtype=torch.int64, device=device))
