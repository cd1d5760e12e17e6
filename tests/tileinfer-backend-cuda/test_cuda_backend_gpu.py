"""CUDA backend checks the conformance suite does not make (GPU only).

- device sampling and acceptance give exactly the host's tokens (``tileinfer.sampling``) over
  many seeds, vocabulary sizes and filters;
- a captured CUDA graph of a sequence of ops, replayed on new inputs, equals the eager run;
- the on-disk cubin cache is reused by a new process;
- the decode GEMV, the prefill GEMM and split-KV attention at model-sized shapes match ref;
- decode attention (attention_decode.cu, 1..16 tokens) matches ref across page and tile
  boundaries, and each row of a verify step equals its 1-token step bit for bit;
- the row-streaming GEMV (gemv_rows.cu) in several configurations, split-K on and off, matches ref
  for every dtype / epilogue / output at 1..8 tokens, and every row of a k-token step equals its
  1-token step bit for bit;
- the bf16 / INT8 model path takes no fallback to ref.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from tileinfer.backend.registry import get_backend
from tileinfer.backend.sampling import SamplingParams, accept_host, accept_rows, sample_host, sample_rows
from tileinfer.testing.conformance import assert_close, fill_paged_step, quantize_weight

pytestmark = pytest.mark.gpu

DEV = "cuda"


def _weight(rows, cols, g, int8, std=0.02):
    """A random (rows, cols) bf16 weight from generator g (on g's device), INT8-quantized per row
    when int8: (weight, scale or None) on the GPU."""
    w = (torch.randn(rows, cols, generator=g, device=g.device) * std).to(torch.bfloat16)
    if not int8:
        return w.to(DEV), None
    q, scale = quantize_weight(w)
    return q.to(DEV), scale.to(DEV)


@pytest.fixture(scope="module")
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return get_backend("cuda")


@pytest.fixture(scope="module")
def ref():
    return get_backend("ref")


@pytest.fixture(scope="module")
def cuda_ops(cuda):
    from tileinfer_backend_cuda import ops

    return ops


def _llm_like_logits(n, vocab, gen, spread=4.0):
    """Logits with a heavy head like a language model's: a few large values over a broad tail."""
    base = torch.randn(n, vocab, generator=gen) * spread
    hot = torch.randint(0, vocab, (n, 8), generator=gen)
    base.scatter_(1, hot, base.gather(1, hot).abs() + 3 * spread)
    return base


# --- sampling ------------------------------------------------------------------------------------

SAMPLING = [
    SamplingParams(0.0),
    SamplingParams(1.0),
    SamplingParams(0.7, top_k=50),
    SamplingParams(0.9, top_p=0.9),
    SamplingParams(1.0, top_k=40, top_p=0.95),
    SamplingParams(1.5, top_p=0.5),
    SamplingParams(0.6, top_k=1),
    SamplingParams(2.0, top_p=0.99),          # a flat distribution: many top-p candidates
    SamplingParams(1.0, top_k=5000, top_p=0.8),  # more than the shared-memory candidate capacity
]


def _device_tokens(cuda, logits, params, seed, counter, with_probs=False):
    n = logits.shape[0]
    out = torch.full((n,), -1, dtype=torch.int32, device=DEV)
    probs = torch.full_like(logits, float("nan")) if with_probs else None
    cuda.sample_tokens(out, logits, params.temperature, params.top_k, params.top_p,
                       torch.tensor([seed], dtype=torch.int64, device=DEV),
                       torch.tensor([counter], dtype=torch.int64, device=DEV), probs)
    return out.cpu().long(), probs


@pytest.mark.parametrize("params", SAMPLING, ids=str)
@pytest.mark.parametrize("vocab", [32000, 128256])
def test_sampling_matches_host_over_many_seeds(cuda, params, vocab):
    """Token for token the host definition (sample_rows on the CPU, row j on stream counter + j)."""
    gen = torch.Generator().manual_seed(vocab + int(params.temperature * 100) + params.top_k)
    rows, seeds = 16, 8
    mismatches = []
    for seed in range(seeds):
        logits = _llm_like_logits(rows, vocab, gen)
        counter = 1000 * seed + 7
        dev, _ = _device_tokens(cuda, logits.to(DEV), params, seed * 7919 - 3, counter)
        host = sample_rows(logits, params, torch.tensor([seed * 7919 - 3]), torch.tensor([counter]))
        for j in torch.nonzero(dev != host).flatten().tolist():
            mismatches.append((seed, j, int(dev[j]), int(host[j])))
    assert not mismatches, f"{len(mismatches)}/{rows * seeds} rows differ (seed, row, device, host): {mismatches[:10]}"


def test_sample_host_itself_agrees(cuda):
    """The one-row host API, on a handful of rows, with large 64-bit seeds and counters."""
    gen = torch.Generator().manual_seed(5)
    logits = _llm_like_logits(6, 50000, gen)
    for params in SAMPLING:
        for seed, counter in ((0, 0), (2**40 + 17, 2**33 + 5), (-12345, 99)):
            dev, _ = _device_tokens(cuda, logits.to(DEV), params, seed, counter)
            for j in range(logits.shape[0]):
                assert int(dev[j]) == sample_host(logits[j], params, seed, counter + j), (params, seed, j)


@pytest.mark.parametrize("params", SAMPLING, ids=str)
def test_sampling_matches_ref_on_device_many_seeds(cuda, ref, params):
    """Against the ref backend on the same GPU (same float library): 200 seeds, probabilities too."""
    gen = torch.Generator().manual_seed(11)
    logits = _llm_like_logits(8, 32000, gen).to(DEV)
    for seed in range(200):
        dev, probs = _device_tokens(cuda, logits, params, seed, 3 * seed, with_probs=True)
        expected = torch.empty(8, dtype=torch.int32, device=DEV)
        probs_ref = torch.empty_like(logits)
        ref.sample_tokens(expected, logits, params.temperature, params.top_k, params.top_p,
                          torch.tensor([seed], device=DEV), torch.tensor([3 * seed], device=DEV), probs_ref)
        assert dev.tolist() == expected.cpu().long().tolist(), (params, seed)
        if seed < 3:
            assert_close(probs, probs_ref, torch.float16, what="filtered probabilities")


@pytest.mark.parametrize("params", SAMPLING[1:6], ids=str)
@pytest.mark.parametrize("with_q", [False, True], ids=["onehot-q", "draft-q"])
def test_accept_matches_host_over_many_seeds(cuda, params, with_q):
    gen = torch.Generator().manual_seed(3)
    n, vocab = 32, 32000
    mismatches = []
    for seed in range(10):
        logits = _llm_like_logits(n, vocab, gen)
        draft_logits = logits + torch.randn(n, vocab, generator=gen)
        q = torch.softmax(draft_logits, -1) if with_q else None
        drafts = torch.multinomial(torch.softmax(draft_logits, -1), 1, generator=gen)[:, 0].to(torch.int32)
        out = torch.full((n,), -1, dtype=torch.int32, device=DEV)
        cuda.accept_tokens(out, logits.to(DEV), drafts.to(DEV), None if q is None else q.to(DEV),
                           params.temperature, params.top_k, params.top_p,
                           torch.tensor([seed], device=DEV), torch.tensor([10 * seed], device=DEV))
        host = accept_rows(logits, drafts, q, params, torch.tensor([seed]), torch.tensor([10 * seed]))
        for j in torch.nonzero(out.cpu().long() != host).flatten().tolist():
            mismatches.append((seed, j, int(out[j]), int(host[j])))
    assert not mismatches, f"{len(mismatches)} rows differ (seed, row, device, host): {mismatches[:10]}"
    # and the one-row host API on a few rows
    j = 0
    assert int(out[j]) == accept_host(logits[j], int(drafts[j]), None if q is None else q[j], params, 9, 90 + j)


# --- CUDA graphs ---------------------------------------------------------------------------------


class TinyLayer:
    """One decoder layer's worth of ops on static buffers (n tokens of one sequence)."""

    def __init__(self, n, hidden=512, heads=8, kv_heads=2, head_dim=64, inter=768, vocab=1000,
                 int8=False, kv_int8=False, max_ctx=512, page_size=16, seed=0):
        g = torch.Generator().manual_seed(seed)
        r = lambda *s, scale=0.05: (torch.randn(*s, generator=g) * scale).to(torch.bfloat16).to(DEV)  # noqa: E731
        self.n, self.hidden, self.heads, self.kv_heads, self.head_dim = n, hidden, heads, kv_heads, head_dim

        def weight(o, i):
            w = r(o, i)
            if int8:
                q, s = quantize_weight(w.cpu())
                return q.to(DEV), s.to(DEV)
            return w, None

        self.norm1 = r(hidden, scale=1.0) + 1
        self.norm2 = r(hidden, scale=1.0) + 1
        self.w_qkv = weight((heads + 2 * kv_heads) * head_dim, hidden)
        self.w_o = weight(hidden, heads * head_dim)
        self.w_gate_up = weight(2 * inter, hidden)
        self.w_down = weight(hidden, inter)
        self.w_head = weight(vocab, hidden)
        self.q_norm, self.k_norm = r(head_dim, scale=1.0) + 1, r(head_dim, scale=1.0) + 1
        pages = max_ctx // page_size + 1
        shape = (pages, page_size, kv_heads, head_dim)
        if kv_int8:
            self.k_cache = torch.zeros(shape, dtype=torch.int8, device=DEV)
            self.v_cache = torch.zeros(shape, dtype=torch.int8, device=DEV)
            self.k_scale = torch.ones(shape[:3], device=DEV)
            self.v_scale = torch.ones(shape[:3], device=DEV)
            self.k_smooth = (torch.rand(kv_heads, head_dim, generator=g) + 0.5).to(DEV)
        else:
            self.k_cache = torch.zeros(shape, dtype=torch.bfloat16, device=DEV)
            self.v_cache = torch.zeros(shape, dtype=torch.bfloat16, device=DEV)
            self.k_scale = self.v_scale = self.k_smooth = None
        self.block_table = torch.arange(pages, dtype=torch.int32, device=DEV)[None, :]
        inv = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        ang = torch.arange(max_ctx, dtype=torch.float64)[:, None] * inv
        self.cos, self.sin = ang.cos().float().to(DEV), ang.sin().float().to(DEV)
        # static inputs
        self.x = torch.zeros(n, hidden, dtype=torch.bfloat16, device=DEV)
        self.positions = torch.zeros(n, dtype=torch.int32, device=DEV)
        self.slots = torch.zeros(n, dtype=torch.int64, device=DEV)
        self.cu = torch.tensor([0, n], dtype=torch.int32, device=DEV)
        self.ctx = torch.zeros(1, dtype=torch.int32, device=DEV)
        self.seed = torch.zeros(1, dtype=torch.int64, device=DEV)
        self.counter = torch.zeros(1, dtype=torch.int64, device=DEV)
        self.max_ctx = max_ctx
        # static intermediates and outputs
        e = lambda *s, dtype=torch.bfloat16: torch.empty(*s, dtype=dtype, device=DEV)  # noqa: E731
        self.residual, self.h = e(n, hidden), e(n, hidden)
        self.qkv, self.q = e(n, (heads + 2 * kv_heads) * head_dim), e(n, heads, head_dim)
        self.attn = e(n, heads, head_dim)
        self.o = e(n, hidden)
        self.gate_up, self.act, self.down = e(n, 2 * inter), e(n, inter), e(n, hidden)
        self.logits = e(n, vocab, dtype=torch.float32)
        self.tokens = e(n, dtype=torch.int32)

    def set_inputs(self, x, start):
        self.x.copy_(x)
        self.residual.copy_(x)
        pos = torch.arange(start, start + self.n, dtype=torch.int32, device=DEV)
        self.positions.copy_(pos)
        self.slots.copy_(pos.long())
        self.ctx.fill_(start + self.n)
        self.seed.fill_(start + 1)
        self.counter.fill_(3 * start)

    def step(self, ops, workspace):
        ops.rmsnorm(self.h, self.residual, self.norm1, 1e-6)
        ops.linear(self.qkv, self.h, *self.w_qkv)
        ops.attention_inputs(self.q, self.k_cache, self.v_cache, self.k_scale, self.v_scale,
                             self.k_smooth, self.qkv, self.q_norm, self.k_norm, self.cos, self.sin,
                             self.positions, self.slots, 1e-6)
        ops.attention(self.attn, self.q, self.k_cache, self.v_cache, self.k_scale, self.v_scale,
                      self.k_smooth, self.cu, self.ctx, self.block_table, self.n, self.max_ctx,
                      self.head_dim ** -0.5, True, workspace)
        ops.linear(self.o, self.attn.view(self.n, -1), *self.w_o)
        ops.add_rmsnorm(self.residual, self.h, self.o, self.norm2, 1e-6)
        ops.linear_swiglu(self.act, self.h, *self.w_gate_up, self.gate_up)
        ops.linear(self.down, self.act, *self.w_down)
        ops.add_rmsnorm(self.residual, self.h, self.down, self.norm2, 1e-6)
        ops.linear(self.logits, self.h, *self.w_head)
        ops.sample_tokens(self.tokens, self.logits, 0.8, 20, 0.9, self.seed, self.counter, None)

    def outputs(self):
        return [t.clone() for t in (self.residual, self.logits, self.tokens, self.attn)]


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_graph_replay_equals_eager(cuda, cuda_ops, n, int8, pdl):
    """The graph (captured with programmatic dependent launch when pdl) replays the eager,
    plain launches' results exactly."""
    layer = TinyLayer(n, int8=int8, kv_int8=int8)
    ws = cuda.attention_workspace(n, layer.heads, layer.head_dim, layer.max_ctx, DEV)
    g = torch.Generator().manual_seed(1)
    inputs = [((torch.randn(n, layer.hidden, generator=g)).to(torch.bfloat16).to(DEV), start)
              for start in (0, 37, 200, 100)]
    # Eager reference results, from a fresh cache each time the same way as the replays below.
    layer.set_inputs(*inputs[0])
    layer.step(cuda, ws)  # warm-up: compiles and loads every kernel before capture
    torch.cuda.synchronize()

    def eager(x, start):
        layer.set_inputs(x, start)
        layer.step(cuda, ws)
        return layer.outputs()

    cache_state = [t.clone() if t is not None else None for t in (layer.k_cache, layer.v_cache, layer.k_scale, layer.v_scale)]
    expected = [eager(x, s) for x, s in inputs]

    def restore():
        for t, saved in zip((layer.k_cache, layer.v_cache, layer.k_scale, layer.v_scale), cache_state):
            if t is not None:
                t.copy_(saved)

    restore()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    saved_pdl = cuda_ops.PDL
    cuda_ops.PDL = pdl
    try:
        with torch.cuda.stream(stream):
            layer.set_inputs(*inputs[0])
            layer.step(cuda, ws)  # warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(stream)
        restore()
        layer.set_inputs(*inputs[0])
        with torch.cuda.graph(graph):
            layer.step(cuda, ws)
    finally:
        cuda_ops.PDL = saved_pdl
    restore()
    for (x, start), want in zip(inputs, expected):
        layer.set_inputs(x, start)
        graph.replay()
        got = layer.outputs()
        for a, b, name in zip(got, want, ("residual", "logits", "tokens", "attention")):
            assert torch.equal(a, b), f"graph replay differs from eager in {name} (start {start})"


# --- the cubin cache across processes ------------------------------------------------------------


def test_disk_cache_reused_by_a_new_process(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    script = (
        "import torch\n"
        "from tileinfer.backend.registry import get_backend\n"
        "from tileinfer_backend_cuda import compiler\n"
        "ops = get_backend('cuda')\n"
        "x = torch.arange(4 * 256, dtype=torch.float32, device='cuda').reshape(4, 256).to(torch.bfloat16)\n"
        "w = torch.ones(256, dtype=torch.bfloat16, device='cuda')\n"
        "out = torch.empty_like(x)\n"
        "ops.rmsnorm(out, x, w, 1e-6)\n"
        "torch.cuda.synchronize()\n"
        "print(compiler.stats.compiled, compiler.stats.cache_hits, float(out.float().sum()))\n"
    )
    env = {**os.environ, "TILEINFER_CACHE": str(tmp_path), "TILEINFER_BACKENDS": "cuda"}
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    (c1, h1, s1), (c2, h2, s2) = [r.stdout.split() for r in runs]
    assert (int(c1), int(h1)) == (1, 0)
    assert (int(c2), int(h2)) == (0, 1)
    assert s1 == s2


# --- model-sized shapes --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("out_f,in_f", [(6144, 4096), (4096, 14336), (2000, 1032)])
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_decode_gemv_model_shapes(cuda, ref, n, out_f, in_f, int8):
    g = torch.Generator().manual_seed(out_f + in_f + n)
    x = torch.randn(n, in_f, generator=g).to(torch.bfloat16).to(DEV)
    w, scale = _weight(out_f, in_f, g, int8)
    for out_dtype in (torch.bfloat16, torch.float32):
        out = torch.full((n, out_f), float("nan"), dtype=out_dtype, device=DEV)
        expected = torch.empty_like(out)
        cuda.linear(out, x, w, scale)
        ref.linear(expected, x, w, scale)
        assert_close(out, expected, torch.bfloat16)


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_decode_swiglu_xielu_model_shapes(cuda, ref, int8):
    g = torch.Generator().manual_seed(2)
    n, hidden, inter = 4, 4096, 14336
    x = torch.randn(n, hidden, generator=g).to(torch.bfloat16).to(DEV)
    w, scale = _weight(2 * inter, hidden, g, int8)
    out, expected = (torch.empty(n, inter, dtype=torch.bfloat16, device=DEV) for _ in range(2))
    scratch = torch.empty(n, 2 * inter, dtype=torch.bfloat16, device=DEV)
    cuda.linear_swiglu(out, x, w, scale, scratch)
    ref.linear_swiglu(expected, x, w, scale, scratch.clone())
    assert_close(out, expected)
    xielu = (0.8, 0.9, 0.5, -1e-6)
    wu, su = w[:inter], None if scale is None else scale[:inter]
    cuda.linear_xielu(out, x, wu, su, *xielu)
    ref.linear_xielu(expected, x, wu, su, *xielu)
    assert_close(out, expected)


@pytest.mark.parametrize("n", [9, 300])
@pytest.mark.parametrize("in_f", [1024, 1032])
def test_prefill_gemm(cuda, ref, n, in_f):
    g = torch.Generator().manual_seed(n + in_f)
    x = torch.randn(n, in_f, generator=g).to(torch.bfloat16).to(DEV)
    w = (torch.randn(700, in_f, generator=g) * 0.03).to(torch.bfloat16)
    q, scale = quantize_weight(w)
    for weight, s in ((w.to(DEV), None), (q.to(DEV), scale.to(DEV))):
        for out_dtype in (torch.bfloat16, torch.float32):
            out = torch.full((n, 700), float("nan"), dtype=out_dtype, device=DEV)
            expected = torch.empty_like(out)
            cuda.linear(out, x, weight, s)
            ref.linear(expected, x, weight, s)
            assert_close(out, expected, torch.bfloat16)


@pytest.mark.parametrize("kind", ["bf16", "int8", "int8-smooth"])
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
    max_q, max_ctx = max(q_lens), table.shape[1] * page_size
    ws = cuda.attention_workspace(q.shape[0], heads, head_dim, max_ctx, q.device)
    expected = torch.empty_like(q)
    ref.attention(expected, q, *cache.pools(), cu, ctx, table, max_q, max_ctx, scale, causal, None)
    results = []
    for _ in range(3):  # the split counters reset themselves: repeated calls agree exactly
        out = torch.full_like(q, float("nan"))
        cuda.attention(out, q, *cache.pools(), cu, ctx, table, max_q, max_ctx, scale, causal, ws)
        results.append(out)
    assert_close(results[0], expected)
    assert torch.equal(results[0], results[1]) and torch.equal(results[1], results[2])


def test_model_path_takes_no_fallback(cuda, cuda_ops):
    cuda_ops.fallback_counts.clear()
    for int8 in (False, True):
        for n in (1, 5, 40):
            layer = TinyLayer(n, int8=int8, kv_int8=int8, seed=n)
            ws = cuda.attention_workspace(n, layer.heads, layer.head_dim, layer.max_ctx, DEV)
            layer.set_inputs(torch.randn(n, layer.hidden, device=DEV).to(torch.bfloat16), 10)
            layer.step(cuda, ws)
    torch.cuda.synchronize()
    assert not cuda_ops.fallback_counts, dict(cuda_ops.fallback_counts)
    assert not cuda.fallbacks, cuda.fallbacks


# --- launch configurations and row invariance ----------------------------------------------------
# Greedy speculative decoding needs a row's result in a verify step of k tokens to equal the same
# row computed in a 1-token step, bit for bit; the tuning sweeps (bench.py) must only pick among
# correct configurations.

GEMV_SWEEP_SAMPLE = [None, {"kernel": "mma"}, {"kernel": "mma", "warps": 2, "stages": 3, "l2_256b": False},
                     {"kernel": "mma", "warps": 4, "stages": 2, "l2_256b": False},
                     {"kernel": "mma", "warps": 16, "stages": 4, "l2_256b": True}]


@pytest.mark.parametrize("cfg", GEMV_SWEEP_SAMPLE, ids=lambda c: "default" if c is None else
                         "mma" if "warps" not in c else
                         f"w{c['warps']}s{c['stages']}{'L2' if c['l2_256b'] else ''}")
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_gemv_configs_match_ref_and_rows_match_one_token_steps(cuda, ref, cuda_ops, cfg, int8):
    g = torch.Generator().manual_seed(11)
    out_f, in_f, n = 3000, 4096, 8
    x = torch.randn(n, in_f, generator=g).to(torch.bfloat16).to(DEV)
    w, scale = _weight(2 * out_f, in_f, g, int8)
    cuda_ops.gemv_overrides.clear()
    if cfg is not None:
        cuda_ops.gemv_overrides.update(cfg)
    try:
        wo, so = w[:out_f], None if scale is None else scale[:out_f]
        out = torch.full((n, out_f), float("nan"), dtype=torch.bfloat16, device=DEV)
        cuda.linear(out, x, wo, so)
        act = torch.full((n, out_f), float("nan"), dtype=torch.bfloat16, device=DEV)
        cuda.linear_swiglu(act, x, w, scale, torch.empty(n, 2 * out_f, dtype=torch.bfloat16, device=DEV))
        for j in range(n):
            one = torch.empty(1, out_f, dtype=torch.bfloat16, device=DEV)
            cuda.linear(one, x[j:j + 1], wo, so)
            assert torch.equal(one[0], out[j]), f"linear row {j} differs from its 1-token step"
            cuda.linear_swiglu(one, x[j:j + 1], w, scale,
                               torch.empty(1, 2 * out_f, dtype=torch.bfloat16, device=DEV))
            assert torch.equal(one[0], act[j]), f"swiglu row {j} differs from its 1-token step"
    finally:
        cuda_ops.gemv_overrides.clear()
    expected = torch.empty_like(out)
    ref.linear(expected, x, wo, so)
    assert_close(out, expected, torch.bfloat16)


# --- the row-streaming GEMV (gemv_rows.cu) --------------------------------------------------------
# Configurations: the heuristic's, and tiles / warps / grid splits around it. K = 1040 (bf16 and
# INT8) is no multiple of a warp step (256 bf16 / 512 int8 elements): the last round is masked;
# split in 3 (whole warp steps a split), the last split holds only 16 elements of K, split in 2
# (bf16) 768 + 272. Idle warps: 8 warps for 3 to 5 steps. 300 output rows: the last row tile is
# partial for every ROWS.
ROWS_CONFIGS = [
    {"kernel": "rows"},
    {"kernel": "rows", "rows": 2, "unroll": 4, "warps": 2, "split_k": 2},
    {"kernel": "rows", "rows": 8, "unroll": 1, "warps": 4, "split_k": 3},
    {"kernel": "rows", "rows": 1, "unroll": 3, "warps": 8, "split_k": 1},
]
ROWS_OUT_F, ROWS_IN_F = 300, 1040
XIELU_PARAMS = (0.8, 0.9, 0.5, -1e-6)


def _rows_id(cfg):
    if "rows" not in cfg:
        return "default"
    return f"r{cfg['rows']}u{cfg['unroll']}w{cfg['warps']}k{cfg['split_k']}"


@pytest.fixture(scope="module")
def rows_builds(cuda_ops):
    """Every gemv_rows.cu build the tests below launch, compiled in parallel up front (each test
    would otherwise compile two or three builds one after the other)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from tileinfer_backend_cuda import compiler

    device = torch.cuda.current_device()
    arch = compiler.device_arch(device)
    jobs = {}
    for cfg in ROWS_CONFIGS:
        for int8 in (False, True):
            for epilogue, outs in (("none", ("bf16_t", "float")), ("swiglu", ("bf16_t",)),
                                   ("xielu", ("bf16_t",))):
                saved = dict(cuda_ops.gemv_overrides)
                cuda_ops.gemv_overrides.clear()
                cuda_ops.gemv_overrides.update(cfg)
                try:
                    full = cuda_ops.gemv_config(ROWS_OUT_F, ROWS_IN_F, int8, epilogue, device)
                finally:
                    cuda_ops.gemv_overrides.clear()
                    cuda_ops.gemv_overrides.update(saved)
                for out_name in outs:
                    for tokens in (1, cuda_ops.GEMV_MAX_TOKENS):
                        d = cuda_ops.gemv_rows_defines(full, int8, epilogue, out_name, tokens,
                                                       cuda_ops._pdl(device))
                        jobs[tuple(sorted(d.items()))] = (arch, d)
    with ProcessPoolExecutor(max_workers=max(1, min(16, (os.cpu_count() or 2) - 1)),
                             mp_context=multiprocessing.get_context("fork")) as pool:
        list(pool.map(_compile_rows, jobs.values()))


def _compile_rows(job):
    from tileinfer_backend_cuda import compiler

    arch, defines = job
    compiler.compile_cubin("gemv_rows.cu", arch, defines)


def _rows_modules_loaded(cfg_warps):
    from tileinfer_backend_cuda import compiler

    return [m for m in compiler.loaded_modules()
            if m.file == "gemv_rows.cu" and m.defines.get("WARPS") == cfg_warps]


def _call(backend, epilogue, out, x, w, scale):
    """The linear op of ``epilogue`` on ``backend`` (cuda, or ref for the expected values)."""
    if epilogue == "swiglu":
        backend.linear_swiglu(out, x, w, scale, torch.empty(x.shape[0], w.shape[0],
                                                            dtype=torch.bfloat16, device=DEV))
    elif epilogue == "xielu":
        backend.linear_xielu(out, x, w, scale, *XIELU_PARAMS)
    else:
        backend.linear(out, x, w, scale)


@pytest.mark.parametrize("cfg", ROWS_CONFIGS, ids=_rows_id)
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("epilogue,out_dtype", [("none", torch.bfloat16), ("none", torch.float32),
                                                ("swiglu", torch.bfloat16), ("xielu", torch.bfloat16)],
                         ids=["none-bf16", "none-f32", "swiglu", "xielu"])
def test_gemv_rows_matches_ref_and_rows_match_one_token_steps(cuda, ref, cuda_ops, rows_builds, cfg,
                                                              int8, epilogue, out_dtype):
    """n = 1..8 tokens against ref; the first n rows of an 8-token call equal the n-token call
    and each row equals its 1-token call, bit for bit; repeated split-K calls agree exactly
    (the arrival counters re-arm themselves)."""
    g = torch.Generator().manual_seed(7 + int8)
    n_max = cuda_ops.GEMV_MAX_TOKENS
    w_rows = 2 * ROWS_OUT_F if epilogue == "swiglu" else ROWS_OUT_F
    x = torch.randn(n_max, ROWS_IN_F, generator=g).to(torch.bfloat16).to(DEV)
    w, scale = _weight(w_rows, ROWS_IN_F, g, int8, std=0.03)
    cuda_ops.gemv_overrides.clear()
    cuda_ops.gemv_overrides.update(cfg)
    cuda_ops.fallback_counts.clear()
    try:
        full = cuda_ops.gemv_config(ROWS_OUT_F, ROWS_IN_F, int8, epilogue, torch.cuda.current_device())
        assert full["kernel"] == "rows"
        out8 = torch.full((n_max, ROWS_OUT_F), float("nan"), dtype=out_dtype, device=DEV)
        _call(cuda, epilogue, out8, x, w, scale)
        for _ in range(2):
            again = torch.full_like(out8, float("nan"))
            _call(cuda, epilogue, again, x, w, scale)
            assert torch.equal(again, out8), "a repeated call differs"
        for n in range(1, n_max):
            out = torch.full((n, ROWS_OUT_F), float("nan"), dtype=out_dtype, device=DEV)
            _call(cuda, epilogue, out, x[:n], w, scale)
            assert torch.equal(out, out8[:n]), f"the {n}-token step differs from the 8-token rows"
            expected = torch.empty_like(out)
            _call(ref, epilogue, expected, x[:n], w, scale)
            assert_close(out, expected, torch.bfloat16, what=f"{n} tokens")
        for j in range(n_max):
            one = torch.full((1, ROWS_OUT_F), float("nan"), dtype=out_dtype, device=DEV)
            _call(cuda, epilogue, one, x[j:j + 1], w, scale)
            assert torch.equal(one[0], out8[j]), f"row {j} differs from its 1-token step"
    finally:
        cuda_ops.gemv_overrides.clear()
    expected = torch.empty_like(out8)
    _call(ref, epilogue, expected, x, w, scale)
    assert_close(out8, expected, torch.bfloat16, what="8 tokens")
    assert not cuda_ops.fallback_counts, dict(cuda_ops.fallback_counts)
    assert _rows_modules_loaded(full["warps"]), "the rows kernel did not run"


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("shape", [(4096, 4096, "none"), (14336, 4096, "swiglu"), (4096, 14336, "none"),
                                   (2048, 8192, "none"), (128256, 2048, "none")],
                         ids=["o", "gate_up", "down", "down-1b", "lm_head-1b"])
def test_gemv_rows_default_and_split_model_shapes(cuda, ref, cuda_ops, int8, shape):
    """The default configuration and a grid split of K at model shapes (no tail), 1 and 3
    tokens, against ref and row for row against the 1-token step."""
    o_rows, in_f, epilogue = shape
    g = torch.Generator(device=DEV).manual_seed(o_rows + in_f)  # large weights: made on the GPU
    w_rows = 2 * o_rows if epilogue == "swiglu" else o_rows
    x = torch.randn(3, in_f, generator=g, device=DEV).to(torch.bfloat16)
    w, scale = _weight(w_rows, in_f, g, int8)
    expected = torch.empty(3, o_rows, dtype=torch.bfloat16, device=DEV)
    _call(ref, epilogue, expected, x, w, scale)
    for cfg in ({"kernel": "rows"}, {"kernel": "rows", "split_k": 4}):
        cuda_ops.gemv_overrides.clear()
        cuda_ops.gemv_overrides.update(cfg)
        try:
            out = torch.full((3, o_rows), float("nan"), dtype=torch.bfloat16, device=DEV)
            _call(cuda, epilogue, out, x, w, scale)
            one = torch.full((1, o_rows), float("nan"), dtype=torch.bfloat16, device=DEV)
            _call(cuda, epilogue, one, x[2:3], w, scale)
        finally:
            cuda_ops.gemv_overrides.clear()
        assert_close(out, expected, torch.bfloat16, what=str(cfg))
        assert torch.equal(one[0], out[2]), f"{cfg}: row 2 differs from its 1-token step"


def test_gemv_rows_split_k_graph_replay(cuda, cuda_ops):
    """A captured split-K GEMV replays on new inputs exactly as it runs eagerly (the counters are
    re-armed by the kernel, the scratch was reserved before the capture)."""
    g = torch.Generator().manual_seed(9)
    in_f, o_rows = 4096, 1024
    w = (torch.randn(o_rows, in_f, generator=g) * 0.02).to(torch.bfloat16).to(DEV)
    xs = [torch.randn(2, in_f, generator=g).to(torch.bfloat16).to(DEV) for _ in range(3)]
    x = torch.empty_like(xs[0])
    out = torch.empty(2, o_rows, dtype=torch.bfloat16, device=DEV)
    cuda.attention_workspace(2, 8, 128, 1024, DEV)  # reserves the GEMV's split-K scratch too
    cuda_ops.gemv_overrides.clear()
    cuda_ops.gemv_overrides.update({"kernel": "rows", "rows": 4, "unroll": 2, "warps": 2, "split_k": 4})
    try:
        eager = []
        for xi in xs:
            x.copy_(xi)
            cuda.linear(out, x, w, None)
            eager.append(out.clone())
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            cuda.linear(out, x, w, None)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(3):  # the same counters, three times in one graph
                cuda.linear(out, x, w, None)
    finally:
        cuda_ops.gemv_overrides.clear()
    for xi, want in zip(xs, eager):
        x.copy_(xi)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


# attention.cu's configurations (decode steps on it: "decode" off) and attention_decode.cu's.
ATTN_SWEEP_SAMPLE = [{"decode": False, "stages": 3}, {"decode": False, "blocks_per_sm": 1, "stages": 3},
                     {"decode": False, "blocks_per_sm": 6}, {"decode_blocks_per_sm": 1, "decode_stages": 2},
                     {"decode_blocks_per_sm": 4, "decode_stages": 1}, {"decode_stages": 4},
                     {"decode_blocks_per_sm": 3}]


@pytest.mark.parametrize("kind", ["bf16", "int8", "int8-smooth"])
@pytest.mark.parametrize("cfg", ATTN_SWEEP_SAMPLE, ids=str)
def test_attention_configs_match_ref(cuda, ref, cuda_ops, kind, cfg):
    gen = torch.Generator().manual_seed(5)
    q_lens, context_lens, heads, kv_heads, head_dim, page_size = [1, 4, 1], [9000, 1500, 70], 32, 8, 128, 16
    q, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, DEV, gen)
    scale = head_dim ** -0.5
    max_q, max_ctx = max(q_lens), table.shape[1] * page_size
    ws = cuda.attention_workspace(q.shape[0], heads, head_dim, max_ctx, q.device)
    expected = torch.empty_like(q)
    ref.attention(expected, q, *cache.pools(), cu, ctx, table, max_q, max_ctx, scale, True, None)
    cuda_ops.attention_overrides.clear()
    cuda_ops.attention_overrides.update(cfg)
    try:
        out = torch.full_like(q, float("nan"))
        cuda.attention(out, q, *cache.pools(), cu, ctx, table, max_q, max_ctx, scale, True, ws)
        again = torch.full_like(q, float("nan"))
        cuda.attention(again, q, *cache.pools(), cu, ctx, table, max_q, max_ctx, scale, True, ws)
    finally:
        cuda_ops.attention_overrides.clear()
    assert_close(out, expected)
    assert torch.equal(out, again)


def _assert_rows_equal_one_token_steps(cuda, out, q, cache, table, context, max_ctx, scale, ws):
    """Row i of out (a k-token causal step's output, k = len(q)) equals the 1-token step at
    position context - 1 + i on the same cache, bit for bit."""
    cu1 = torch.tensor([0, 1], dtype=torch.int32, device=DEV)
    for i in range(q.shape[0]):
        one = torch.full_like(q[:1], float("nan"))
        cuda.attention(one, q[i:i + 1].contiguous(), *cache.pools(), cu1,
                       torch.tensor([context + i], dtype=torch.int32, device=DEV), table, 1,
                       max_ctx, scale, True, ws)
        assert torch.equal(one[0], out[i]), f"row {i} of the {q.shape[0]}-token step differs"


@pytest.mark.parametrize("kind", ["bf16", "int8", "int8-smooth"])
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
    out = torch.full_like(q, float("nan"))
    cu = torch.tensor([0, k], dtype=torch.int32, device=DEV)
    cuda.attention(out, q, *cache.pools(), cu, torch.tensor([total], dtype=torch.int32, device=DEV),
                   table, k, max_ctx, scale, True, ws)
    _assert_rows_equal_one_token_steps(cuda, out, q, cache, table, context, max_ctx, scale, ws)


# --- attention_with_inputs: attention_decode.cu's fused attention inputs ------------------------


@pytest.mark.parametrize("kind", ["bf16", "int8", "int8-smooth"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qknorm"])
@pytest.mark.parametrize("case", [  # q_lens, context_lens, heads, kv_heads, head_dim, page_size
    ([1], [1], 32, 8, 128, 16),                      # first token: one split
    ([1], [144], 32, 8, 128, 16),                    # the profiled decode step (3 splits)
    ([1, 1, 1], [4000, 1, 2500], 32, 8, 128, 16),    # batched, long contexts: many splits
    ([1], [3000], 9, 3, 64, 64),                     # SmolLM2 heads, pages of 64
    ([1, 1], [700, 65], 16, 2, 256, 16),             # head_dim 256, GQA 8
])
def test_fused_attention_inputs_equal_the_two_ops(cuda, cuda_ops, kind, qk_norm, case):
    """1-token steps: the fused kernel gives the bits of attention_inputs then attention (the
    decode_fused_inputs = False path), in the output and in every byte of the cache; its rows
    therefore also equal a verify step's, which runs the two ops."""
    from tileinfer.testing.conformance import decode_step_inputs, rand, rope_tables

    q_lens, context_lens, heads, kv_heads, head_dim, page_size = case
    gen = torch.Generator().manual_seed(sum(context_lens) + head_dim)
    _, cache, cu, ctx, table = fill_paged_step(q_lens, context_lens, heads, kv_heads, head_dim,
                                               page_size, kind, DEV, gen)
    qkv, positions, slots = decode_step_inputs(q_lens, context_lens, table.cpu(), heads, kv_heads,
                                               head_dim, page_size, DEV, gen)
    norms = (None, None)
    if qk_norm:
        norms = tuple(rand((head_dim,), torch.bfloat16, DEV, 1.0, gen) + 1 for _ in range(2))
    cos, sin = rope_tables(8192, head_dim, DEV)
    n, max_ctx = qkv.shape[0], table.shape[1] * page_size
    ws = cuda.attention_workspace(n, heads, head_dim, max_ctx, DEV)
    step = (qkv, *norms, cos, sin, positions, slots, 1e-6, cu, ctx, table, 1, max_ctx,
            head_dim ** -0.5, True, ws)
    results = []
    for fused in (True, False):
        pools = cache.clone()
        out = torch.full((n, heads, head_dim), float("nan"), dtype=torch.bfloat16, device=DEV)
        cuda_ops.attention_overrides.update(decode_fused_inputs=fused)
        try:
            cuda.attention_with_inputs(out, torch.empty_like(out), *pools.pools(), *step)
        finally:
            cuda_ops.attention_overrides.clear()
        results.append((out, pools))
    assert any(m.file == "attention_decode.cu" and m.defines.get("FUSED_INPUTS")
               for m in compiler_modules()), "the fused kernel did not run"
    (fused_out, fused_cache), (two_ops_out, two_ops_cache) = results
    assert not fused_out.isnan().any()
    assert torch.equal(fused_out, two_ops_out)
    for name in ("k", "v", "k_scale", "v_scale"):  # bit patterns: unwritten slots hold NaN
        a, b = getattr(fused_cache, name), getattr(two_ops_cache, name)
        assert (a is None and b is None) or torch.equal(a.view(torch.uint8), b.view(torch.uint8)), \
            f"{name} differs"


def compiler_modules():
    from tileinfer_backend_cuda import compiler

    return compiler.loaded_modules()


# --- decode attention (attention_decode.cu: the warps split each key tile) -----------------------

# Contexts across page (16 or 64) and tile (64) boundaries, and query tokens (1..12, 32 in all:
# the workspace's capacity); the rows of a step cross the boundaries too.
DECODE_CONTEXTS = [1, 15, 16, 17, 63, 64, 65, 130, 1000, 5000]
DECODE_Q_LENS = [1, 2, 3, 8, 1, 12, 1, 1, 1, 2]


def _decode_module_loaded():
    from tileinfer_backend_cuda import compiler

    return any(m.file == "attention_decode.cu" for m in compiler.loaded_modules())


@pytest.mark.parametrize("kind", ["bf16", "int8", "int8-smooth"])
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
    expected = torch.empty_like(q)
    max_q = max(q_lens)
    ref.attention(expected, q, *cache.pools(), cu, ctx, table, max_q, max_ctx, scale, causal, None)
    out = torch.full_like(q, float("nan"))
    cuda.attention(out, q, *cache.pools(), cu, ctx, table, max_q, max_ctx, scale, causal, ws)
    assert _decode_module_loaded()
    assert_close(out, expected, what="batched step")
    for b, n in enumerate(q_lens):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        one = torch.full_like(q[rows], float("nan"))
        cuda.attention(one, q[rows].contiguous(), *cache.pools(),
                       torch.tensor([0, n], dtype=torch.int32, device=DEV), ctx[b:b + 1].contiguous(),
                       table[b:b + 1].contiguous(), n, max_ctx, scale, causal, ws)
        assert_close(one, expected[rows], what=f"sequence {b} alone ({n} tokens, {contexts[b]} keys)")


@pytest.mark.parametrize("kind", ["bf16", "int8", "int8-smooth"])
@pytest.mark.parametrize("head_dim,group", [(128, 4), (64, 8), (128, 1), (256, 4), (64, 2)],
                         ids=["d128-g4", "d64-g8", "d128-g1", "d256-g4", "d64-g2"])
@pytest.mark.parametrize("k", [2, 5, 8, 16])
@pytest.mark.parametrize("where", ["short", "tile", "split"])
def test_decode_attention_verify_rows_equal_one_token_rows(cuda, ref, cuda_ops, kind, head_dim, group,
                                                           k, where):
    """Row i of a k-token causal step equals the 1-token step at its position bit for bit, with
    the k positions across a tile boundary (at 64 or 1024 keys) or across the context length at
    which the keys per split grow (64 * num_splits: that step's rows split the context
    differently, and the block loads two runs of tiles). d256-g4 and d64-g8 have two row tiles
    at 8 tokens, four at 16 (a DFlash block)."""
    heads, kv_heads, page_size = 8 * group, 8, 16
    splits = cuda_ops.attention_decode_splits(1, kv_heads, cuda_ops.MAX_SPLITS,
                                              torch.cuda.current_device())
    boundary = {"short": 64, "tile": 1024, "split": 64 * splits}[where]
    total = boundary + k // 2  # the rows see total - k + 1 .. total keys: boundary and boundary + 1
    context = total - k + 1
    gen = torch.Generator().manual_seed(total + k + head_dim)
    q, cache, _, _, table = fill_paged_step([k], [total], heads, kv_heads, head_dim, page_size,
                                            kind, DEV, gen)
    scale = head_dim ** -0.5
    max_ctx = max(table.shape[1] * page_size, 64 * 64 * 4)  # enough for `splits` splits
    ws = cuda.attention_workspace(k, heads, head_dim, max_ctx, q.device)
    assert cuda_ops.attention_decode_splits(1, kv_heads, ws.shape[2],
                                            torch.cuda.current_device()) == splits
    out = torch.full_like(q, float("nan"))
    cu = torch.tensor([0, k], dtype=torch.int32, device=DEV)
    cuda.attention(out, q, *cache.pools(), cu, torch.tensor([total], dtype=torch.int32, device=DEV),
                   table, k, max_ctx, scale, True, ws)
    expected = torch.empty_like(q)
    ref.attention(expected, q, *cache.pools(), cu, torch.tensor([total], dtype=torch.int32, device=DEV),
                  table, k, max_ctx, scale, True, None)
    assert_close(out, expected)
    _assert_rows_equal_one_token_steps(cuda, out, q, cache, table, context, max_ctx, scale, ws)


@pytest.mark.parametrize("gemv", [{}, {"kernel": "mma"}, {"kernel": "rows", "warps": 2, "split_k": 2}],
                         ids=["default", "mma", "rows-split"])
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_pdl_chain_equals_plain_launches(cuda, cuda_ops, int8, gemv):
    """With programmatic dependent launch (ops.PDL) the GEMVs start before the previous kernel
    ends; the chain norm -> GEMV -> GEMV -> norm -> SwiGLU GEMV -> GEMV must give exactly the
    plain launches' results, eagerly and replayed from a CUDA graph (for both GEMV kernel
    families, and with split-K GEMVs back to back on the same counters)."""
    g = torch.Generator().manual_seed(3)
    hidden, inter = 2048, 8192

    w = {"qkv": _weight(3072, hidden, g, int8), "o": _weight(hidden, hidden, g, int8),
         "gate_up": _weight(2 * inter, hidden, g, int8), "down": _weight(hidden, inter, g, int8)}
    norm_w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).to(DEV)
    x0 = torch.randn(1, hidden, generator=g).to(torch.bfloat16).to(DEV)
    bf = dict(dtype=torch.bfloat16, device=DEV)
    residual, normed, delta = torch.empty(1, hidden, **bf), torch.empty(1, hidden, **bf), torch.empty(1, hidden, **bf)
    qkv, act, gate_up = torch.empty(1, 3072, **bf), torch.empty(1, inter, **bf), torch.empty(1, 2 * inter, **bf)

    def chain():
        for _ in range(3):
            cuda.add_rmsnorm(residual, normed, delta, norm_w, 1e-5)
            cuda.linear(qkv, normed, *w["qkv"])
            cuda.linear(delta, qkv[:, :hidden], *w["o"])
            cuda.add_rmsnorm(residual, normed, delta, norm_w, 1e-5)
            cuda.linear_swiglu(act, normed, *w["gate_up"], gate_up)
            cuda.linear(delta, act, *w["down"])

    def run(pdl, graph=False):
        saved = cuda_ops.PDL
        cuda_ops.PDL = pdl
        cuda_ops.gemv_overrides.clear()
        cuda_ops.gemv_overrides.update(gemv)
        try:
            residual.copy_(x0)
            delta.zero_()
            if not graph:
                chain()
            else:
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    chain()  # warm-up: compiles and loads outside the capture
                torch.cuda.current_stream().wait_stream(stream)
                residual.copy_(x0)
                delta.zero_()
                torch.cuda.synchronize()
                cuda_graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(cuda_graph):
                    chain()
                residual.copy_(x0)
                delta.zero_()
                cuda_graph.replay()
            torch.cuda.synchronize()
            return residual.clone(), delta.clone()
        finally:
            cuda_ops.PDL = saved
            cuda_ops.gemv_overrides.clear()

    plain = run(False)
    assert torch.isfinite(plain[0].float()).all()
    for got in (run(True), run(True, graph=True)):
        assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])


@pytest.mark.gpu
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
        out = torch.full_like(q, float("nan"))
        cuda.attention(out, q, *cache.pools(), cu, ctx, table, 1, max_ctx, head_dim ** -0.5, True,
                       ws)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
