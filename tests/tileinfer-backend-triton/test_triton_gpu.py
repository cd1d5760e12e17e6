"""Triton backend on a CUDA GPU: real model shapes against the ref backend (cuBLAS, PyTorch),
and a decode step captured in a CUDA graph that replays bit-identically to eager execution (the
ops allocate nothing once reserve_scratch has run and never synchronize; the split-K counters
re-arm themselves)."""

from __future__ import annotations

import pytest
import torch

from tileinfer.backend.registry import get_backend
from tileinfer.backend.sampling import SamplingParams, sample_host
from tileinfer.backend.types import QKTransform
from tileinfer.testing.conformance import (assert_close, attention_step, fill_paged_step,
                                           make_weight, poisoned, rand)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def ops():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return get_backend("triton")


@pytest.fixture(scope="module")
def ref():
    return get_backend("ref")


DEV = "cuda"
LLAMA3_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
             "down": (4096, 14336), "lm_head": (128256, 4096)}


@pytest.mark.parametrize("m", [1, 3, 16, 300])
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("name", list(LLAMA3_8B))
def test_linear_llama3_8b_shapes(ops, ref, name, int8, m):
    n, k = LLAMA3_8B[name]
    torch.manual_seed(0)
    x = rand((m, k), torch.bfloat16, DEV)
    w, scale = make_weight(n, k, DEV, int8)
    out_dtype = torch.float32 if name == "lm_head" else torch.bfloat16
    if name == "gate_up":
        out, exp = poisoned((m, n // 2), torch.bfloat16, DEV), poisoned((m, n // 2), torch.bfloat16, DEV)
        ops.linear_swiglu(out, x, w, scale, poisoned((m, n), torch.bfloat16, DEV))
        ref.linear_swiglu(exp, x, w, scale, poisoned((m, n), torch.bfloat16, DEV))
    else:
        out, exp = poisoned((m, n), out_dtype, DEV), poisoned((m, n), out_dtype, DEV)
        ops.linear(out, x, w, scale)
        ref.linear(exp, x, w, scale)
    assert_close(out, exp, dtype=torch.bfloat16)


@pytest.mark.parametrize("kind", ["bf16", "int8", "int8-smooth"])
@pytest.mark.parametrize("ctx", [8192, 32768])
def test_decode_attention_long_context(ops, ref, kind, ctx):
    gen = torch.Generator().manual_seed(ctx)
    q, cache, cu, ctx_t, table = fill_paged_step([1], [ctx - 5], 32, 8, 128, 16, kind, DEV, gen)
    max_ctx = table.shape[1] * 16
    ws = ops.attention_workspace(1, 32, 128, max_ctx, q.device)
    out, exp = poisoned(q.shape, q.dtype, DEV), poisoned(q.shape, q.dtype, DEV)
    step = attention_step(cu, ctx_t, table, 1, max_ctx)
    ops.attention(out, q, cache.kv, step, 128 ** -0.5, True, ws)
    ref.attention(exp, q, cache.kv, step, 128 ** -0.5, True, None)
    assert_close(out, exp)


def test_prefill_attention_2048(ops, ref):
    gen = torch.Generator().manual_seed(1)
    q, cache, cu, ctx_t, table = fill_paged_step([2048, 300], [2048, 700], 32, 8, 128, 16, "bf16",
                                                 DEV, gen)
    step = attention_step(cu, ctx_t, table, 2048, table.shape[1] * 16)
    for causal in (True, False):
        out, exp = poisoned(q.shape, q.dtype, DEV), poisoned(q.shape, q.dtype, DEV)
        ops.attention(out, q, cache.kv, step, 128 ** -0.5, causal, None)
        ref.attention(exp, q, cache.kv, step, 128 ** -0.5, causal, None)
        assert_close(out, exp)


@pytest.mark.parametrize("params", [SamplingParams(0.0), SamplingParams(1.0),
                                    SamplingParams(0.8, top_k=40, top_p=0.95)], ids=str)
def test_sampling_full_vocab_matches_host(ops, params):
    rows, vocab = 4, 128256
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(2)) * 4
    out = poisoned((rows,), torch.int32, DEV)
    for seed in (0, 77, -5):
        ops.sample_tokens(out, logits.to(DEV), params.temperature, params.top_k, params.top_p,
                          torch.tensor([seed], device=DEV), torch.tensor([100], device=DEV), None)
        assert out.cpu().tolist() == [sample_host(logits[j], params, seed, 100 + j) for j in range(rows)]


def test_decode_step_replays_in_a_cuda_graph(ops):
    """norm -> qkv GEMV (split-K) -> attention inputs -> split-KV attention -> o GEMV -> norm
    -> SwiGLU GEMV -> down GEMV -> LM head -> sampling, captured once and replayed."""
    torch.manual_seed(0)
    hidden, heads, kv_heads, hd, inter, vocab, page = 2048, 32, 8, 64, 8192, 32000, 16
    ctx = 3000
    gen = torch.Generator().manual_seed(4)
    _, cache, cu, ctx_t, table = fill_paged_step([1], [ctx], heads, kv_heads, hd, page, "int8", DEV, gen)
    max_ctx = table.shape[1] * page
    w = {name: make_weight(n, k, DEV, False)[0] for name, (n, k) in {
        "qkv": ((heads + 2 * kv_heads) * hd, hidden), "o": (hidden, heads * hd),
        "gate_up": (2 * inter, hidden), "down": (hidden, inter), "lm_head": (vocab, hidden)}.items()}
    norm_w = torch.ones(hidden, dtype=torch.bfloat16, device=DEV)
    inv = 1.0 / 10000 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(4096, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = ang.cos().float().to(DEV), ang.sin().float().to(DEV)
    residual = rand((1, hidden), torch.bfloat16, DEV)
    delta = rand((1, hidden), torch.bfloat16, DEV)
    bufs = dict(x=torch.empty(1, hidden, dtype=torch.bfloat16, device=DEV),
                qkv=torch.empty(1, (heads + 2 * kv_heads) * hd, dtype=torch.bfloat16, device=DEV),
                q=torch.empty(1, heads, hd, dtype=torch.bfloat16, device=DEV),
                attn=torch.empty(1, heads, hd, dtype=torch.bfloat16, device=DEV),
                mlp=torch.empty(1, inter, dtype=torch.bfloat16, device=DEV),
                logits=torch.empty(1, vocab, dtype=torch.float32, device=DEV),
                token=torch.empty(1, dtype=torch.int32, device=DEV))
    positions = (ctx_t - 1).clone()
    slots = (table[0, (ctx - 1) // page].long() * page + (ctx - 1) % page).reshape(1)
    step_meta = attention_step(cu, ctx_t, table, 1, max_ctx, positions, slots)
    qk = QKTransform(cos, sin)
    seed, counter = torch.tensor([7], device=DEV), torch.tensor([0], device=DEV)
    ops.reserve_scratch(torch.device(DEV))  # as a model's new_buffers: before any capture
    ws = ops.attention_workspace(1, heads, hd, max_ctx, DEV)

    def step():
        b = bufs
        ops.add_rmsnorm(residual, b["x"], delta, norm_w, 1e-5)
        ops.linear(b["qkv"], b["x"], w["qkv"], None)
        ops.attention_inputs(b["q"], cache.kv, b["qkv"], qk, step_meta)
        ops.attention(b["attn"], b["q"], cache.kv, step_meta, hd ** -0.5, True, ws)
        ops.linear(delta, b["attn"].view(1, heads * hd), w["o"], None)
        ops.add_rmsnorm(residual, b["x"], delta, norm_w, 1e-5)
        ops.linear_swiglu(b["mlp"], b["x"], w["gate_up"], None, None)
        ops.linear(delta, b["mlp"], w["down"], None)
        ops.add_rmsnorm(residual, b["x"], delta, norm_w, 1e-5)
        ops.linear(b["logits"], b["x"], w["lm_head"], None)
        ops.sample_tokens(b["token"], b["logits"], 0.9, 50, 0.9, seed, counter, None)

    start = (residual.clone(), delta.clone(), cache.clone())
    step()  # compile every kernel before capture
    torch.cuda.synchronize()

    def reset():
        residual.copy_(start[0])
        delta.copy_(start[1])
        for name in ("k", "v", "k_scale", "v_scale"):
            getattr(cache, name).copy_(getattr(start[2], name))

    reset()
    step()
    eager = {k: v.clone() for k, v in bufs.items()}
    eager_res = residual.clone()

    graph = torch.cuda.CUDAGraph()
    reset()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(3):
        reset()
        graph.replay()
        torch.cuda.synchronize()
        for k, v in eager.items():
            assert torch.equal(bufs[k], v), k
        assert torch.equal(residual, eager_res)
