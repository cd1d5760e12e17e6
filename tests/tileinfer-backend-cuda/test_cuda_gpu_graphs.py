"""The CUDA backend's ops together on the GPU: a layer's chain of ops captured in a CUDA graph
replays the eager results exactly (with and without programmatic dependent launch), the model's
path takes no fallback to ref, the PDL chain of norms and GEMVs equals plain launches, and a new
process reuses the on-disk cubin cache."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from tileinfer.backend.types import AttentionStep, LayerKV, QKTransform
from tileinfer.testing.conformance import quantize_weight

from cuda_gpu import DEV, weight

pytestmark = pytest.mark.gpu


class TinyLayer:
    """One decoder layer's worth of ops on static buffers (n tokens of one sequence), called as
    the model calls them."""

    def __init__(self, n, hidden=512, heads=8, kv_heads=2, head_dim=64, inter=768, vocab=1000,
                 int8=False, kv_int8=False, max_ctx=512, page_size=16, seed=0):
        g = torch.Generator().manual_seed(seed)
        r = lambda *s, scale=0.05: (torch.randn(*s, generator=g) * scale).to(torch.bfloat16).to(DEV)  # noqa: E731
        self.n, self.hidden, self.heads, self.kv_heads, self.head_dim = n, hidden, heads, kv_heads, head_dim

        def lin(o, i):
            w = r(o, i)
            if int8:
                q, s = quantize_weight(w.cpu())
                return q.to(DEV), s.to(DEV)
            return w, None

        self.norm1 = r(hidden, scale=1.0) + 1
        self.norm2 = r(hidden, scale=1.0) + 1
        self.w_qkv = lin((heads + 2 * kv_heads) * head_dim, hidden)
        self.w_o = lin(hidden, heads * head_dim)
        self.w_gate_up = lin(2 * inter, hidden)
        self.w_down = lin(hidden, inter)
        self.w_head = lin(vocab, hidden)
        q_norm, k_norm = r(head_dim, scale=1.0) + 1, r(head_dim, scale=1.0) + 1
        pages = max_ctx // page_size + 1
        shape = (pages, page_size, kv_heads, head_dim)
        if kv_int8:
            self.kv = LayerKV(torch.zeros(shape, dtype=torch.int8, device=DEV),
                              torch.zeros(shape, dtype=torch.int8, device=DEV),
                              torch.ones(shape[:3], device=DEV), torch.ones(shape[:3], device=DEV),
                              (torch.rand(kv_heads, head_dim, generator=g) + 0.5).to(DEV))
        else:
            self.kv = LayerKV(torch.zeros(shape, dtype=torch.bfloat16, device=DEV),
                              torch.zeros(shape, dtype=torch.bfloat16, device=DEV))
        block_table = torch.arange(pages, dtype=torch.int32, device=DEV)[None, :]
        inv = 1.0 / 10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        ang = torch.arange(max_ctx, dtype=torch.float64)[:, None] * inv
        self.qk = QKTransform(ang.cos().float().to(DEV), ang.sin().float().to(DEV), q_norm, k_norm,
                              1e-6)
        # static inputs
        self.x = torch.zeros(n, hidden, dtype=torch.bfloat16, device=DEV)
        self.step = AttentionStep(torch.zeros(n, dtype=torch.int32, device=DEV),
                                  torch.zeros(n, dtype=torch.int64, device=DEV),
                                  torch.tensor([0, n], dtype=torch.int32, device=DEV),
                                  torch.zeros(1, dtype=torch.int32, device=DEV), block_table,
                                  n, max_ctx)
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

    def cache_tensors(self):
        kv = self.kv
        return [t for t in (kv.k_cache, kv.v_cache, kv.k_scale, kv.v_scale) if t is not None]

    def set_inputs(self, x, start):
        self.x.copy_(x)
        self.residual.copy_(x)
        pos = torch.arange(start, start + self.n, dtype=torch.int32, device=DEV)
        self.step.positions.copy_(pos)
        self.step.slots.copy_(pos.long())
        self.step.context_lens.fill_(start + self.n)
        self.seed.fill_(start + 1)
        self.counter.fill_(3 * start)

    def run(self, ops, workspace):
        """The model's step: attention_with_inputs (one kernel at n = 1, the two ops above)."""
        ops.rmsnorm(self.h, self.residual, self.norm1, 1e-6)
        ops.linear(self.qkv, self.h, *self.w_qkv)
        ops.attention_with_inputs(self.attn, self.q, self.kv, self.qkv, self.qk, self.step,
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
def test_graph_replay_equals_eager(cuda, n, int8, pdl):
    """The graph (captured with programmatic dependent launch when pdl) replays the eager,
    default launches' results exactly."""
    from tileinfer_backend_cuda.ops import tuning

    layer = TinyLayer(n, int8=int8, kv_int8=int8)
    cuda.reserve_scratch(DEV)
    ws = cuda.attention_workspace(n, layer.heads, layer.head_dim, layer.max_ctx, DEV)
    g = torch.Generator().manual_seed(1)
    inputs = [((torch.randn(n, layer.hidden, generator=g)).to(torch.bfloat16).to(DEV), start)
              for start in (0, 37, 200, 100)]
    layer.set_inputs(*inputs[0])
    layer.run(cuda, ws)  # warm-up: compiles and loads every kernel before capture
    torch.cuda.synchronize()
    cache_state = [t.clone() for t in layer.cache_tensors()]

    def restore():
        for t, saved in zip(layer.cache_tensors(), cache_state):
            t.copy_(saved)

    expected = []
    for x, start in inputs:  # eager, one after the other from cache_state, as the replays below
        layer.set_inputs(x, start)
        layer.run(cuda, ws)
        expected.append(layer.outputs())
    restore()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with tuning.experiment({"pdl": pdl}):
        with torch.cuda.stream(stream):
            layer.set_inputs(*inputs[0])
            layer.run(cuda, ws)  # warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(stream)
        restore()
        layer.set_inputs(*inputs[0])
        with torch.cuda.graph(graph):
            layer.run(cuda, ws)
    restore()
    for (x, start), want in zip(inputs, expected):
        layer.set_inputs(x, start)
        graph.replay()
        got = layer.outputs()
        for a, b, name in zip(got, want, ("residual", "logits", "tokens", "attention")):
            assert torch.equal(a, b), f"graph replay differs from eager in {name} (start {start})"


def test_model_path_takes_no_fallback(cuda):
    from tileinfer_backend_cuda import ops

    ops.fallback_counts.clear()
    for int8 in (False, True):
        for n in (1, 5, 40):
            layer = TinyLayer(n, int8=int8, kv_int8=int8, seed=n)
            ws = cuda.attention_workspace(n, layer.heads, layer.head_dim, layer.max_ctx, DEV)
            layer.set_inputs(torch.randn(n, layer.hidden, device=DEV).to(torch.bfloat16), 10)
            layer.run(cuda, ws)
    torch.cuda.synchronize()
    assert not ops.fallback_counts, dict(ops.fallback_counts)
    assert not cuda.fallbacks, cuda.fallbacks


@pytest.mark.parametrize("gemv", [{}, {"kernel": "mma"}, {"kernel": "rows", "warps": 2, "split_k": 2}],
                         ids=["default", "mma", "rows-split"])
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_pdl_chain_equals_plain_launches(cuda, int8, gemv):
    """With programmatic dependent launch the GEMVs start before the previous kernel ends; the
    chain norm -> GEMV -> GEMV -> norm -> SwiGLU GEMV -> GEMV must give exactly the plain
    launches' results, eagerly and replayed from a CUDA graph (for both GEMV kernel families,
    and with split-K GEMVs back to back on the same counters)."""
    from tileinfer_backend_cuda.ops import tuning

    g = torch.Generator().manual_seed(3)
    hidden, inter = 2048, 8192
    w = {"qkv": weight(3072, hidden, g, int8), "o": weight(hidden, hidden, g, int8),
         "gate_up": weight(2 * inter, hidden, g, int8), "down": weight(hidden, inter, g, int8)}
    norm_w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).to(DEV)
    x0 = torch.randn(1, hidden, generator=g).to(torch.bfloat16).to(DEV)
    bf = dict(dtype=torch.bfloat16, device=DEV)
    residual, normed, delta = torch.empty(1, hidden, **bf), torch.empty(1, hidden, **bf), torch.empty(1, hidden, **bf)
    qkv, act, gate_up = torch.empty(1, 3072, **bf), torch.empty(1, inter, **bf), torch.empty(1, 2 * inter, **bf)
    cuda.reserve_scratch(DEV)

    def chain():
        for _ in range(3):
            cuda.add_rmsnorm(residual, normed, delta, norm_w, 1e-5)
            cuda.linear(qkv, normed, *w["qkv"])
            cuda.linear(delta, qkv[:, :hidden], *w["o"])
            cuda.add_rmsnorm(residual, normed, delta, norm_w, 1e-5)
            cuda.linear_swiglu(act, normed, *w["gate_up"], gate_up)
            cuda.linear(delta, act, *w["down"])

    def run(pdl, graph=False):
        with tuning.experiment({"pdl": pdl, "gemv": gemv}):
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

    plain = run(False)
    assert torch.isfinite(plain[0].float()).all()
    for got in (run(True), run(True, graph=True)):
        assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1])


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
