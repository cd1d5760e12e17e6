"""Row invariance of the triton backend's decode / verify paths.

Greedy speculative decoding must emit exactly plain greedy's tokens, so a verify step of
k + 1 <= 8 tokens has to compute every row bit for bit as a 1-token decode step of that row
would: the row alone, at its own position, with its own context length. These tests compute
each row of a 5- or 8-token step alone and inside the step and require ``torch.equal``, for
every op whose programs reduce across elements (linear and its fused epilogues with and without
split-K, the norms, attention with several context lengths, some straddling a split boundary,
and the fused attention inputs). Correctness against the ref backend is checked elsewhere
(the conformance suite and test_triton_kernels.py). Each is also run for a float32
model, whose float32 outputs are not rounded to bf16: a different summation order shows there
even where the bf16 rounding would hide it.

They run wherever the triton backend is available: under ``TRITON_INTERPRET=1`` on the CPU
(small shapes) and on a CUDA GPU.
"""

from __future__ import annotations

from dataclasses import astuple

import pytest
import torch

from tileinfer.backend.registry import BackendError, get_backend
from tileinfer.testing.conformance import (
    XIELU,
    Cache,
    attention_step,
    fill_paged_step,
    make_weight,
    poisoned,
    qk_transform,
    rand,
)


@pytest.fixture(scope="module")
def ops():
    try:
        return get_backend("triton")
    except BackendError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def device(ops):
    return torch.device("cuda" if "cuda" in ops.backend.info.devices else "cpu")


def assert_rows_equal(step_out, row_out, i, what):
    """Row i of a step's output equals the 1-row step's output, bit for bit (NaN = unwritten)."""
    a, b = step_out.cpu(), row_out.cpu()
    assert not a.float().isnan().any() and not b.float().isnan().any(), f"{what}: unwritten"
    diff = (a.float() - b.float()).abs()
    assert torch.equal(a, b), (f"{what}: row {i} differs between the step and the row alone "
                               f"(max |diff| {float(diff.max()):.3g})")


# --- linear ------------------------------------------------------------------------------------

LINEAR_CONFIGS = {  # None: the launcher's defaults; others force split-K / unrolling
    "default": None,
    "split4-unroll": dict(block_n=16, block_k=32, split_k=4, unroll=2),
    "split3": dict(block_n=32, block_k=64, split_k=3),
    "narrow-2warps": dict(block_n=4, block_k=256, num_warps=2, unroll=2),  # SmolLM2's qkv entry
    # a step's rows 2 or 4 to a row program (GemvConfig.rows_per_program)
    "rows2-split2": dict(block_n=8, block_k=64, split_k=2, rows_per_program=2),
    "rows4-unroll": dict(block_n=4, block_k=64, unroll=2, rows_per_program=4),
    "rows4-wide": dict(block_n=8, block_k=512, num_warps=4, unroll=2, rows_per_program=4),
    "rows4-swiglu": dict(block_n=8, block_k=256, num_warps=4, unroll=2, rows_per_program=4),
    # the tensor-core tiles for a single sequence's rows (padded to 16), as GEMV_TABLE may ask
    "dot": dict(block_n=32, block_k=64, num_stages=1, dot=True),
    "dot-split2": dict(block_n=16, block_k=64, split_k=2, dot=True),
}


@pytest.mark.parametrize("cfg", list(LINEAR_CONFIGS))
@pytest.mark.parametrize("act", [0, 1, 2, "logits"], ids=["linear", "swiglu", "xielu", "logits"])
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("m", [5, 8])
def test_linear_rows_alone_equal_rows_in_the_step(device, m, dtype, int8, act, cfg):
    """logits: a bf16 model's lm_head, whose float32 sums are stored unrounded."""
    from tileinfer_backend_triton.kernels import linear

    if cfg.startswith("dot") and dtype == torch.float32:
        pytest.skip("float32 models never take the dot tiles for a sequence's rows (GEMV_TABLE "
                    "is for bf16 and INT8 weights)")
    if device.type == "cpu" and cfg != "default" and (m != 8 or dtype != torch.bfloat16):
        pytest.skip("on the CPU the forced configs run 8 bf16 rows (the GPU, where the order of "
                    "a sum depends on the compiled layout, runs every case)")
    out_dtype = torch.float32 if act == "logits" else dtype
    if act == "logits":
        if dtype == torch.float32:
            pytest.skip("a float32 model's logits are its linear case")
        act = linear.ACT_NONE
    # K not a multiple of the tiles, N not a multiple of BLOCK_N; smaller on the CPU, where
    # Triton's interpreter runs each program in Python
    k, n = (200, 72) if device.type == "cuda" else (136, 40)
    config = None if LINEAR_CONFIGS[cfg] is None else linear.GemvConfig(**LINEAR_CONFIGS[cfg])
    torch.manual_seed(m + 10 * act + int8)
    x = rand((m, k), dtype, device)
    w, scale = make_weight(2 * n if act == linear.ACT_SWIGLU else n, k, device, int8)
    if not int8:
        w = w.to(dtype)
    args = astuple(XIELU) if act == linear.ACT_XIELU else (0.0, 0.0, 0.0, 0.0)
    step = poisoned((m, n), out_dtype, device)
    linear.launch_linear(step, x, w, scale, act=act, act_args=args, config=config)
    for i in range(m):
        alone = poisoned((1, n), out_dtype, device)
        linear.launch_linear(alone, x[i:i + 1], w, scale, act=act, act_args=args, config=config)
        assert_rows_equal(step[i:i + 1], alone, i, "linear")


def test_linear_hooks_rows_alone_equal_rows_in_the_step(ops, device):
    """Through the hooks, at a width where the default split-K is on."""
    m, k, n = 8, 1024, 48
    x = rand((m, k), torch.bfloat16, device)
    w, _ = make_weight(n, k, device, False)
    wg, _ = make_weight(2 * n, k, device, False)
    step, step_g = poisoned((m, n), torch.bfloat16, device), poisoned((m, n), torch.bfloat16, device)
    ops.linear(step, x, w, None)
    ops.linear_swiglu(step_g, x, wg, None, None)
    for i in range(m):
        alone, alone_g = poisoned((1, n), torch.bfloat16, device), poisoned((1, n), torch.bfloat16, device)
        ops.linear(alone, x[i:i + 1], w, None)
        ops.linear_swiglu(alone_g, x[i:i + 1], wg, None, None)
        assert_rows_equal(step[i:i + 1], alone, i, "linear")
        assert_rows_equal(step_g[i:i + 1], alone_g, i, "linear_swiglu")


# --- norms -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("d", [64, 2048])
def test_norm_rows_alone_equal_rows_in_the_step(ops, device, d, dtype):
    m = 5
    x = rand((m, d), dtype, device)
    delta = rand((m, d), dtype, device)
    weight = rand((d,), dtype, device) + 1
    step = poisoned((m, d), dtype, device)
    ops.rmsnorm(step, x, weight, 1e-6)
    residual = x.clone()
    step_add = poisoned((m, d), dtype, device)
    ops.add_rmsnorm(residual, step_add, delta, weight, 1e-6)
    for i in range(m):
        alone = poisoned((1, d), dtype, device)
        ops.rmsnorm(alone, x[i:i + 1], weight, 1e-6)
        assert_rows_equal(step[i:i + 1], alone, i, "rmsnorm")
        res_i = x[i:i + 1].clone()
        alone_add = poisoned((1, d), dtype, device)
        ops.add_rmsnorm(res_i, alone_add, delta[i:i + 1], weight, 1e-6)
        assert_rows_equal(step_add[i:i + 1], alone_add, i, "add_rmsnorm")
        assert_rows_equal(residual[i:i + 1], res_i, i, "add_rmsnorm residual")


# --- attention ---------------------------------------------------------------------------------

# (rows in the step, the step's context length): short, one page, a split boundary (MIN_CHUNK =
# 256) inside the step's rows, and several splits (at 1027 a row alone would have split
# 1023 or 1024 positions into chunks other than the step's, before the per-row partition).
ATTN_STEPS = [(5, 9), (8, 40), (5, 258), (8, 515), (5, 1027)]


@pytest.mark.parametrize("kind", ["bf16", "int8-smooth", "f32"])
@pytest.mark.parametrize("step_shape", ATTN_STEPS, ids=lambda s: f"q{s[0]}-ctx{s[1]}")
def test_attention_rows_alone_equal_rows_in_the_step(ops, device, step_shape, kind):
    """Row i of a causal step of q rows over a context of C positions sees C - q + i + 1
    positions; the decode step of that row has that context and one query row."""
    q_len, ctx_len = step_shape
    heads, kv_heads, hd, page = 8, 2, 64, 16
    gen = torch.Generator().manual_seed(ctx_len)
    q, cache, cu, ctx, table = fill_paged_step([q_len], [ctx_len], heads, kv_heads, hd, page,
                                               "bf16" if kind == "f32" else kind, device, gen)
    if kind == "f32":  # a float32 model: float32 queries, cache and output
        q, cache.k, cache.v = q.float(), cache.k.float(), cache.v.float()
    capacity = table.shape[1] * page  # a model's buffers: one workspace size for every step
    scale = hd ** -0.5
    ws = ops.attention_workspace(q_len, heads, hd, capacity, q.device)
    step = poisoned(q.shape, q.dtype, device)
    ops.attention(step, q, cache.kv, attention_step(cu, ctx, table, q_len, ctx_len), scale, True,
                  ws)
    ws1 = ops.attention_workspace(1, heads, hd, capacity, q.device)
    cu1 = torch.tensor([0, 1], dtype=cu.dtype).to(device)
    for i in range(q_len):
        ctx_i = ctx_len - q_len + i + 1
        alone = poisoned(q[i:i + 1].shape, q.dtype, device)
        row_step = attention_step(cu1, torch.tensor([ctx_i], dtype=ctx.dtype).to(device), table,
                                  1, ctx_i)
        ops.attention(alone, q[i:i + 1].contiguous(), cache.kv, row_step, scale, True, ws1)
        assert_rows_equal(step[i:i + 1], alone, i, f"attention (row context {ctx_i})")


# --- fused attention inputs --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bf16", "int8-smooth"])
def test_attention_inputs_rows_alone_equal_rows_in_the_step(ops, device, kind):
    n, heads, kv_heads, hd, page = 5, 4, 2, 64, 16
    qkv = rand((n, (heads + 2 * kv_heads) * hd), torch.bfloat16, device)
    qk = qk_transform(hd, 64, device, qk_norm=True)
    pos = torch.arange(11, 11 + n, dtype=torch.int32).to(device)
    slots = torch.randperm(4 * page)[:n].to(device)
    cache = Cache(4, page, kv_heads, hd, kind, device)
    alone_cache = cache.clone()  # the same smoothing factors
    table = torch.arange(4, dtype=torch.int32, device=device)[None]  # one sequence, pages 0..3

    def step_of(rows):
        m = len(rows)
        return attention_step(torch.tensor([0, m], dtype=torch.int32, device=device),
                              pos[rows][-1:] + 1, table, m, int(pos[rows][-1]) + 1, pos[rows],
                              slots[rows])

    step = poisoned((n, heads, hd), torch.bfloat16, device)
    ops.attention_inputs(step, cache.kv, qkv, qk, step_of(list(range(n))))
    for i in range(n):
        alone = poisoned((1, heads, hd), torch.bfloat16, device)
        ops.attention_inputs(alone, alone_cache.kv, qkv[i:i + 1], qk, step_of([i]))
        assert_rows_equal(step[i:i + 1], alone, i, "attention_inputs queries")
    page_idx, off = (slots // page).cpu(), (slots % page).cpu()
    for name in ("k", "v", "k_scale", "v_scale"):
        a, b = getattr(cache, name), getattr(alone_cache, name)
        if a is not None:
            assert torch.equal(a.cpu()[page_idx, off], b.cpu()[page_idx, off]), name
