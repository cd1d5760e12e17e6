"""gemm_invariant.cu on the GPU: the rows of batch-invariant steps of 17..300 rows bitwise equal
to the same rows' 1-row steps on gemv.cu (what makes a request's output independent of the
batch), for bf16 and INT8 weights, the three epilogues and float32 outputs, split by run (a
cluster a row tile) and not, on mma.sync and on Hopper's wgmma (gemm_wgmma.cu, its weights by
cp.async or TMA); and close to ref."""

from __future__ import annotations

import pytest
import torch
from tileinfer.testing.conformance import assert_close

from cuda_gpu import DEV, XIELU, loaded_modules, weight

pytestmark = pytest.mark.gpu


def _experiment(settings):
    from tileinfer_backend_cuda.ops import tuning

    return tuning.experiment(settings)


@pytest.mark.parametrize("gemm", [{"min_rows": 17},
                                  {"min_rows": 17, "split": False, "row_warps": 8, "stages": 2},
                                  {"min_rows": 17, "row_warps": 2, "stages": 3, "stage_steps": 4,
                                   "l2_256b": False},
                                  {"min_rows": 17, "blocked": True, "stage_steps": 2},
                                  {"min_rows": 17, "blocked": True, "split": False},
                                  {"min_rows": 17, "row_tiles": 2, "stage_steps": 2},
                                  {"min_rows": 17, "row_tiles": 2, "split": False, "stages": 3},
                                  {"min_rows": 17, "chunk": 4, "stage_steps": 2},
                                  {"min_rows": 17, "chunk": 8, "split": False},
                                  {"min_rows": 17, "parts": 1, "stage_steps": 2},
                                  {"min_rows": 17, "parts": 2, "blocked": True},
                                  {"min_rows": 17, "blocked": True, "runs": 8, "row_warps": 8,
                                   "row_tiles": 2, "split": True},
                                  {"min_rows": 17, "nk": True, "stage_steps": 2},
                                  {"min_rows": 17, "nk": True, "blocked": True, "runs": 8,
                                   "row_tiles": 2, "split": True},
                                  {"min_rows": 17, "nk": True, "blocked": True, "runs": 4,
                                   "wgmma": True},
                                  {"min_rows": 17, "nk": True, "blocked": True, "wgmma": True,
                                   "split": False, "row_warps": 8, "stages": 3},
                                  {"min_rows": 17, "parts": 1, "nk": True, "wgmma": True},
                                  {"min_rows": 17, "nk": True, "blocked": True, "runs": 4,
                                   "wgmma": True, "tma": True, "row_warps": 8},
                                  {"min_rows": 17, "parts": 1, "nk": True, "wgmma": True,
                                   "tma": True, "split": False},
                                  {"min_rows": 17, "nk": True, "blocked": True, "runs": 4,
                                   "wgmma": True, "row_warps": 8, "token_groups": 2},
                                  {"min_rows": 17, "nk": True, "blocked": True, "runs": 4,
                                   "wgmma": True, "tma": True, "token_groups": 4},
                                  {"min_rows": 17, "parts": 1, "nk": True, "wgmma": True,
                                   "tma": True, "split": False, "token_groups": 2},
                                  {"min_rows": 17, "nk": True, "blocked": True, "runs": 4,
                                   "wgmma": True, "tma": True, "mma_lag": True,
                                   "token_groups": 4},
                                  {"min_rows": 17, "parts": 1, "nk": True, "wgmma": True,
                                   "mma_lag": True, "split": False, "stages": 3},
                                  {"min_rows": 17, "nk": True, "blocked": True, "runs": 4,
                                   "wgmma": True, "wide": {"split": False, "mma_lag": True,
                                                           "row_warps": 8}},
                                  {"min_rows": 17, "nk": True, "blocked": True, "runs": 4,
                                   "wgmma": True, "tma": True, "split": False,
                                   "producer_warp": True, "row_warps": 8},
                                  {"min_rows": 17, "parts": 1, "nk": True, "wgmma": True,
                                   "tma": True, "split": False, "producer_warp": True,
                                   "token_groups": 2, "stages": 3},
                                  {"min_rows": 17, "nk": True, "blocked": True, "runs": 4,
                                   "wgmma": True, "tma": True,
                                   "wide": {"split": False, "producer_warp": True,
                                            "token_groups": 2}}],
                         ids=["default", "unsplit-w8s2", "w2s3x4", "blocked", "blocked-unsplit",
                              "tiles2", "tiles2-unsplit", "chunk4", "chunk8-unsplit", "parts1",
                              "parts2-blocked", "blocked-runs8", "nk", "nk-blocked-runs8",
                              "wgmma-runs4", "wgmma-unsplit-wg2", "wgmma-parts1",
                              "wgmma-tma-runs4-wg2", "wgmma-tma-parts1", "wgmma-tg2-runs4-wg2",
                              "wgmma-tma-tg4-runs4", "wgmma-tma-tg2-parts1",
                              "wgmma-tma-lag-tg4-runs4", "wgmma-lag-parts1",
                              "wgmma-runs4-wide-unsplit-lag", "wgmma-producer-runs4-wg2",
                              "wgmma-producer-parts1-tg2", "wgmma-runs4-wide-producer-tg2"])
@pytest.mark.parametrize("out_f,in_f", [(3000, 4096), (1000, 1032), (200, 96)],
                         ids=["3000x4096", "1000x1032", "200x96"])
@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_invariant_gemm_rows_equal_one_row_steps(cuda, ref, gemm, out_f, in_f, int8):
    """3000 rows: the last row tile partly past O; K 1032: a last step partly past K (INT8: 8-byte
    chunks); K 96: parts without steps (their zero sums are added too). With "blocked" both
    kernels take contiguous K steps per part, with "chunk" interleaved chunks of that many; with
    "parts" K is split into that many parts (gemv.cu's warps) instead of the weight's default;
    with "wgmma" the launches whose order gemm_wgmma.cu keeps (bf16, products of neighbouring k
    in contiguous parts or one part, K a multiple of 64) run there, with "token_groups" blocks
    of several groups of 64 tokens in the launches of more than 64 rows (300: four groups), with
    "mma_lag" a stage's products in flight through the next stage's barrier, with
    "producer_warp" (TMA, unsplit) gemm_wgmma_ws.cu's warp of copies beside the products, with
    "wide" other settings for the launches of more than 64 rows."""
    from tileinfer.backend.hookspecs import Invariance
    from tileinfer_backend_cuda.ops import tuning

    batch = Invariance.BATCH
    g = torch.Generator().manual_seed(out_f + in_f + int8)
    w, scale = weight(2 * out_f, in_f, g, int8)
    wo, so = w[:out_f], None if scale is None else scale[:out_f]
    for n in (17, 64, 100) + ((300,) if gemm.get("token_groups") else ()):
        x = torch.randn(n, in_f, generator=g).to(torch.bfloat16).to(DEV)
        outs = {name: torch.full((n, out_f), float("nan"), dtype=dtype, device=DEV)
                for name, dtype in (("linear", torch.bfloat16), ("logits", torch.float32),
                                    ("swiglu", torch.bfloat16), ("xielu", torch.bfloat16))}
        scratch = torch.empty(n, 2 * out_f, dtype=torch.bfloat16, device=DEV)

        def run(rows, dest):
            cuda.linear(dest["linear"], x[rows], wo, so, batch_invariant=batch)
            cuda.linear(dest["logits"], x[rows], wo, so, batch_invariant=batch)
            cuda.linear_swiglu(dest["swiglu"], x[rows], w, scale, scratch[rows],
                               batch_invariant=batch)
            cuda.linear_xielu(dest["xielu"], x[rows], wo, so, XIELU, batch_invariant=batch)

        parts = gemm.get("parts")
        settings = {"invariant_gemm": {k: v for k, v in gemm.items() if k != "parts"},
                    **({"gemv": {"warps": parts}} if parts else {})}
        blocked = int(gemm.get("blocked", False))
        chunk = 1 if blocked else gemm.get("chunk", 1)
        nk = int(gemm.get("nk", False) and not int8)

        def in_order(m):  # a build that takes the K steps in this layout (and parts, products)
            return (m.defines.get("BLOCKED_PARTS", 0) == blocked
                    and m.defines.get("PART_CHUNK", 1) == chunk
                    and m.defines.get("NK_PRODUCTS", 0) == nk
                    and parts in (None, m.defines.get("WARPS", m.defines.get("PARTS"))))

        with _experiment(settings):
            run(slice(0, n), outs)
            tiles = tuning.mma_token_tiles(min(n, 64))
            launch = {**gemm, **(gemm.get("wide", {}) if n > 64 else {})}  # n rows' settings
            if gemm.get("wgmma") and not int8 and in_f % 64 == 0:  # its order: wgmma's kernel
                file = "gemm_wgmma.cu"
                if (launch.get("producer_warp") and launch.get("tma")
                        and launch.get("split") is False):
                    file = "gemm_wgmma_ws.cu"
                assert loaded_modules(file, NT=tiles), f"{file} did not run"
                if launch.get("mma_lag"):
                    assert loaded_modules(file, MMA_LAG=1), "no products in flight"
                if launch.get("token_groups") and n > 64:
                    groups = 4 if n > 128 and launch["token_groups"] == 4 else 2
                    assert loaded_modules(file, TG=groups), "no token groups"
            else:
                ran = [m for m in loaded_modules("gemm_invariant.cu", NT=tiles) if in_order(m)]
                assert ran, "gemm_invariant.cu did not run"
            for j in range(n):  # 1-row steps: gemv.cu
                one = {name: torch.empty(1, out_f, dtype=t.dtype, device=DEV)
                       for name, t in outs.items()}
                run(slice(j, j + 1), one)
                for name, t in outs.items():
                    assert torch.equal(one[name][0], t[j]), f"{name} row {j} of {n} differs"
            assert [m for m in loaded_modules("gemv.cu", NT=1) if in_order(m)], (
                "no gemv.cu 1-row build")
        expected = torch.empty_like(outs["linear"])
        ref.linear(expected, x, wo, so)
        assert_close(outs["linear"], expected, torch.bfloat16)


def _captured(call):
    """A CUDA graph of call(), captured on a side stream (the current stream waits for it)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    return graph


def test_invariant_gemm_split_is_used_and_replays_from_a_graph(cuda):
    """A narrow weight's split launch (grid.y = runs, a cluster a row tile) inside a CUDA graph:
    replays give the eager launch's bits."""
    from tileinfer.backend.hookspecs import Invariance

    g = torch.Generator().manual_seed(3)
    w, _ = weight(4096, 4096, g, False)
    x = torch.randn(64, 4096, generator=g).to(torch.bfloat16).to(DEV)
    eager = torch.empty(64, 4096, dtype=torch.bfloat16, device=DEV)
    out = torch.zeros_like(eager)
    with _experiment({"invariant_gemm": {"min_rows": 17}}):
        cuda.linear(eager, x, w, None, batch_invariant=Invariance.BATCH)
        assert loaded_modules("gemm_invariant.cu", SPLIT=1), "no split launch"
        graph = _captured(lambda: cuda.linear(out, x, w, None, batch_invariant=Invariance.BATCH))
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_producer_warp_replays_from_a_graph_with_its_tokens_map(cuda):
    """gemm_wgmma_ws.cu (its tokens' tensor map a kernel argument by value) inside a CUDA graph,
    the activations rewritten between replays: each replay gives the eager launch's bits on the
    new activations."""
    from tileinfer.backend.hookspecs import Invariance

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma is Hopper's")
    g = torch.Generator().manual_seed(5)
    w, _ = weight(4096, 4096, g, False)
    xs = [torch.randn(200, 4096, generator=g).to(torch.bfloat16).to(DEV) for _ in range(3)]
    x = xs[0].clone()
    out = torch.zeros(200, 4096, dtype=torch.bfloat16, device=DEV)
    settings = {"invariant_gemm": {"nk": True, "blocked": True, "runs": 4, "wgmma": True,
                                   "tma": True, "split": False, "producer_warp": True,
                                   "token_groups": 2, "min_rows": 17}}
    with _experiment(settings):
        eager = []
        for xi in xs:
            eager.append(torch.empty_like(out))
            cuda.linear(eager[-1], xi, w, None, batch_invariant=Invariance.BATCH)
        assert loaded_modules("gemm_wgmma_ws.cu", TG=2), "no producer-warp launch"
        graph = _captured(lambda: cuda.linear(out, x, w, None, batch_invariant=Invariance.BATCH))
    for xi, expected in zip(xs, eager):
        x.copy_(xi)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)


@pytest.mark.parametrize("entry", [{"chunk": 4, "row_warps": 8, "stages": 3, "stage_steps": 2,
                                    "split": False},
                                   {"blocked": True, "row_tiles": 2, "stages": 3, "split": False}],
                         ids=["chunk4", "blocked-tiles2"])
@pytest.mark.parametrize("out_f,in_f", [(3000, 4096), (1000, 1032)], ids=["3000x4096", "1000x1032"])
def test_batched_int8_table_steps_close_to_ref(cuda, ref, monkeypatch, entry, out_f, in_f):
    """Outside the batch-invariant mode, INT8 steps of BATCHED_MIN_ROWS..64 rows of a weight in
    BATCHED_GEMM_TABLE run gemm_invariant.cu in the entry's settings and layout (no order to
    keep there): close to ref's, plain and SwiGLU."""
    from tileinfer_backend_cuda.ops import gemm_invariant, tuning

    g = torch.Generator().manual_seed(out_f + in_f)
    w, scale = weight(2 * out_f, in_f, g, True)
    wo, so = w[:out_f], scale[:out_f]
    monkeypatch.setitem(gemm_invariant.BATCHED_GEMM_TABLE, (out_f, in_f, True, "none"), entry)
    monkeypatch.setitem(gemm_invariant.BATCHED_GEMM_TABLE, (out_f, in_f, True, "swiglu"), entry)
    blocked, chunk = int(entry.get("blocked", False)), entry.get("chunk", 1)
    for n in (gemm_invariant.BATCHED_MIN_ROWS, 40, 64):
        x = torch.randn(n, in_f, generator=g).to(torch.bfloat16).to(DEV)
        out = torch.full((n, out_f), float("nan"), dtype=torch.bfloat16, device=DEV)
        swiglu = torch.full_like(out, float("nan"))
        scratch = torch.empty(n, 2 * out_f, dtype=torch.bfloat16, device=DEV)
        cuda.linear(out, x, wo, so, batch_invariant=False)
        cuda.linear_swiglu(swiglu, x, w, scale, scratch, batch_invariant=False)
        assert [m for m in loaded_modules("gemm_invariant.cu", NT=tuning.mma_token_tiles(n))
                if m.defines.get("BLOCKED_PARTS", 0) == blocked
                and m.defines.get("PART_CHUNK", 1) == (1 if blocked else chunk)], (
            "gemm_invariant.cu did not run")
        expected, expected_swiglu = torch.empty_like(out), torch.empty_like(out)
        ref.linear(expected, x, wo, so)
        ref.linear_swiglu(expected_swiglu, x, w, scale, torch.empty_like(scratch))
        assert_close(out, expected, torch.bfloat16)
        assert_close(swiglu, expected_swiglu, torch.bfloat16)
