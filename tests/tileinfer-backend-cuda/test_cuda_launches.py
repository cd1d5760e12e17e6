"""The CUDA ops' launches without a GPU: every op, on CPU tensors of model shapes, with the kernels
replaced by recorders. Each launch must pass its kernel's signature (the argument count and
kinds that compiler.Kernel.launch packs), pick the kernel the op documents, and build it with
the defines the shipped configuration implies (the GPU tests then check the results)."""

from __future__ import annotations

import os

import pytest
import torch
from tileinfer.backend import get_backend
from tileinfer.backend.types import AttentionStep, LayerKV, QKTransform, XIELUScalars

from tileinfer_backend_cuda.ops import (OPS, attention, common, cublas, elementwise,
                                        gemm_invariant, gemm_wgmma, invariant_tuning, kv, linear,
                                        norm, sampling, tuning)

BF = torch.bfloat16


class Launch:
    def __init__(self, file, name, signature, defines, extra, grid, block, args, smem, pdl):
        self.file, self.name, self.defines, self.extra = file, name, dict(defines or {}), extra
        self.grid, self.block, self.args, self.smem, self.pdl = grid, block, args, smem, pdl
        assert len(args) == len(signature), f"{name}: {len(args)} arguments for {signature!r}"
        for kind, a in zip(signature, args):
            ok = {"p": a is None or isinstance(a, torch.Tensor), "i": type(a) is int,
                  "q": type(a) is int, "f": isinstance(a, float),
                  "m": isinstance(a, (list, tuple)) and len(a) == 16}[kind]
            assert ok, f"{name}: {a!r} is no {kind!r} argument"


class BlasLibrary:
    """torch.backends.cuda.preferred_blas_library on a CPU build (which cannot set cuBLASLt):
    the setting as a string, and the setting at each torch.mm call."""

    def __init__(self):
        self.now, self.at_mm = "default", []

    def __call__(self, backend=None):
        if backend is not None:
            self.now = str(backend)
        return self.now

    def mm(self, *args, **kwargs):
        self.at_mm.append((self.now, kwargs.get("out_dtype")))


@pytest.fixture
def launches(monkeypatch):
    """The kernels of every ops module replaced by a recorder; device 0 an H200 (sm_90, 132 SMs)
    with its scratch reserved (on the CPU); the BLAS library setting a BlasLibrary."""
    log = []

    class Recorder:
        def __init__(self, file, name, signature, device, defines=None, extra_options=()):
            self.spec = (file, name, signature, defines, extra_options)

        def launch(self, grid, block, args, smem=0, stream=None, pdl=False):
            log.append(Launch(*self.spec, tuple(grid), tuple(block), args, smem, pdl))

    for mod in (attention, elementwise, gemm_invariant, gemm_wgmma, kv, linear, norm, sampling):
        monkeypatch.setattr(mod, "kernel", Recorder)
        if hasattr(mod, "dev"):
            monkeypatch.setattr(mod, "dev", lambda t: 0)
    monkeypatch.setitem(tuning._pdl_arch, 0, True)
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", BlasLibrary())
    for name, value in (("multi_processor_count", 132), ("shared_memory_per_block_optin", 232448),
                        ("shared_memory_per_multiprocessor", 233472)):
        monkeypatch.setitem(common._device_properties, (0, name), value)
    monkeypatch.setitem(common.GEMV_SCRATCH._by_device, 0,
                        (torch.empty(common.GemvScratch.PARTIALS),
                         torch.zeros(common.GemvScratch.COUNTERS, dtype=torch.int32)))
    rows = common.ArgmaxScratch.ROWS * common.ArgmaxScratch.CHUNKS
    monkeypatch.setitem(common.ARGMAX_SCRATCH._by_device, 0,
                        (torch.empty(rows), torch.empty(rows, dtype=torch.int32),
                         torch.zeros(common.ArgmaxScratch.ROWS, dtype=torch.int32),
                         torch.empty(rows)))
    common.fallback_counts.clear()
    with tuning.experiment({}):
        yield log
    assert not common.fallback_counts, dict(common.fallback_counts)


def _without_shipped_entries(monkeypatch, *shapes):
    """The tables' entries and orders of these (output rows, K, epilogue) shapes dropped, bf16
    and INT8: a test's weights in the defaults whatever the tables ship."""
    for (rows, k_dim, epilogue) in shapes:
        for int8 in (False, True):
            key = (rows, k_dim, int8, epilogue)
            monkeypatch.delitem(gemm_invariant.INVARIANT_GEMM_TABLE, key, raising=False)
            monkeypatch.delitem(invariant_tuning.INVARIANT_ORDER, key, raising=False)


def _weight(rows, cols, int8, e4m3=False):
    """A bf16 weight, or an int8 one (or with e4m3, e4m3 bits: uint8 but the NaN codes) with
    row scales."""
    if e4m3:
        bits = torch.randint(0, 256, (rows, cols), dtype=torch.int16)
        bits = torch.where(bits & 0x7F == 0x7F, 0, bits).to(torch.uint8)
        return bits, torch.rand(rows)
    if int8:
        return torch.randint(-127, 128, (rows, cols), dtype=torch.int8), torch.rand(rows)
    return torch.randn(rows, cols).to(BF), None


LINEAR_FILES = ("gemv.cu", "gemv_rows.cu", "gemm.cu", "gemm_invariant.cu")


def test_embed_and_norms(launches):
    OPS["embed"](torch.empty(3, 4096, dtype=BF), torch.randn(100, 4096).to(BF),
                 torch.tensor([1, 2, 3], dtype=torch.int32))
    x = torch.randn(2, 4096).to(BF)
    OPS["rmsnorm"](torch.empty_like(x), x, torch.ones(4096, dtype=BF), 1e-5)
    OPS["add_rmsnorm"](x, torch.empty_like(x), torch.randn_like(x), torch.ones(4096, dtype=BF), 1e-5)
    heads = torch.randn(2, 32, 128).to(BF)
    OPS["rmsnorm"](torch.empty_like(heads), heads, torch.ones(128, dtype=BF), 1e-6)
    assert [(k.file, k.name) for k in launches] == [
        ("elementwise.cu", "embed"), ("norm.cu", "rmsnorm_block"), ("norm.cu", "add_rmsnorm_block"),
        ("norm.cu", "rmsnorm_warp")]
    assert launches[0].defines == {"VEC16": None}
    assert launches[1].defines == {"DTYPE": "bf16_t", "WEIGHT_DTYPE": "bf16_t", "VEC": 8}
    assert all(k.pdl for k in launches[1:])


@pytest.mark.parametrize("weights", ["bf16", "int8", "e4m3"])
@pytest.mark.parametrize("n,invariant", [(1, True), (3, True), (3, False), (40, False),
                                         (100, False)])
def test_linear_ops(launches, monkeypatch, weights, n, invariant):
    """Which kernels run each linear op at n rows. e4m3 bits (the weight-only FP8 product) take
    INT8's kernels and configurations, built with W_E4M3."""
    int8, e4m3 = weights != "bf16", weights == "e4m3"
    mm_calls = []  # cuBLAS with float32 outputs (no CPU kernel): recorded, not run
    real_mm = torch.mm
    monkeypatch.setattr(linear.torch, "mm", lambda *a, **kw: mm_calls.append(kw.get("out_dtype"))
                        if "out_dtype" in kw else real_mm(*a, **kw))
    x = torch.randn(n, 4096).to(BF)
    w, s = _weight(6144, 4096, int8, e4m3)
    OPS["linear"](torch.empty(n, 6144, dtype=torch.float32), x, w, s, invariant)
    wg, sg = _weight(2 * 1536, 4096, int8, e4m3)
    OPS["linear_swiglu"](torch.empty(n, 1536, dtype=BF), x, wg, sg, torch.empty(n, 3072, dtype=BF),
                         invariant)
    OPS["linear_xielu"](torch.empty(n, 1536, dtype=BF), x, wg[:1536], None if sg is None else sg[:1536],
                        XIELUScalars(0.8, 0.9, 0.5, -1e-6), invariant)
    names = [(k.file, k.name) for k in launches]
    if n == 1 or (n <= common.GEMV_MAX_TOKENS and invariant):  # the row-invariant GEMVs
        assert names == [("gemv_rows.cu", "gemv_rows")] * 3
        assert [k.defines["EPILOGUE"] for k in launches] == [0, 1, 2]
        assert all(k.defines["TOKENS"] == tuning.gemv_rows_tokens(n) and k.pdl for k in launches)
        cfg = tuning.gemv_config(6144, 4096, int8, "none", 0)
        assert cfg == {**tuning.GEMV_ROWS_TABLE[(6144, 4096, int8, "none")], "kernel": "rows"}
        assert launches[0].defines == linear.gemv_rows_defines(
            cfg, int8, "none", "float", tuning.gemv_rows_tokens(n), True) | common.weight_defines(w)
    elif n <= max(common.GEMV_MAX_TOKENS, tuning.wide_max_tokens(int8)):
        # a batched step: the tensor-core GEMV, each weight read once for 8, 16, 32 or 64 slots
        assert names == [("gemv.cu", "gemv")] * 3
        assert [k.defines["EPILOGUE"] for k in launches] == [0, 1, 2]
        assert all(k.defines["NT"] == tuning.mma_token_tiles(n) and k.args[4] == n
                   for k in launches)
    elif int8:  # prefill: gemm.cu, the activations after it
        assert names == [("gemm.cu", "gemm"), ("gemm.cu", "gemm"), ("elementwise.cu", "silu_mul"),
                         ("gemm.cu", "gemm"), ("elementwise.cu", "xielu")]
    else:  # bf16: cuBLAS (no launch of ours), the float32 logits through its float32 outputs
        assert names == [("elementwise.cu", "silu_mul"), ("elementwise.cu", "xielu")]
        assert mm_calls == [torch.float32]
    built = [k.defines.get("W_E4M3") for k in launches if k.file in LINEAR_FILES]
    assert built == [1 if e4m3 else None] * len(built)


@pytest.mark.parametrize("e4m3", [False, True], ids=["int8", "e4m3"])
@pytest.mark.parametrize("out_dtype", [BF, torch.float32])
def test_int8_prefill_runs_on_cublas_with_refs_sums(launches, monkeypatch, out_dtype, e4m3):
    """INT8 products (and e4m3 bits': the weight-only FP8 product) of int8_cublas.MIN_ROWS rows
    and more: no gemm.cu launch, the weight converted
    to bf16 (elementwise.cu) in chunks of output rows (a small CHUNK_BYTES here: 3 chunks of a
    multiple of CHUNK_ALIGN rows and a partial one), cuBLAS's float32 sums (torch.mm with
    out_dtype has no CPU kernel: computed here in float32) times the row scales, rounded once:
    ref's linear bit for bit. SwiGLU: its gate/up sums so, then silu_mul. Fewer rows (or the
    switch's int8_cublas_min_rows above n) stay on gemm.cu."""
    from tileinfer_backend_cuda.ops import int8_cublas

    real_mm = torch.mm
    calls = []

    def mm(a, b, *, out=None, out_dtype=None):
        calls.append((tuple(b.shape), b.dtype, out_dtype))
        return out.copy_(real_mm(a.float(), b.float())) if out_dtype else real_mm(a, b, out=out)

    def weight8_to_bf16(out, part):  # elementwise.cu's conversion (exact), run here on the CPU
        calls.append(("weight8_to_bf16", tuple(part.shape)))
        out.copy_(part.view(torch.float8_e4m3fn) if part.dtype == torch.uint8 else part)

    monkeypatch.setattr(torch, "mm", mm)
    monkeypatch.setattr(elementwise, "weight8_to_bf16", weight8_to_bf16)
    monkeypatch.setattr(int8_cublas, "CHUNK_BYTES", 2 * 576 * 300)  # 300 rows: 256 a chunk
    n = int8_cublas.MIN_ROWS
    x = torch.randn(n, 576).to(BF)
    w, s = _weight(1000, 576, True, e4m3)
    out = torch.full((n, 1000), float("nan"), dtype=out_dtype)
    OPS["linear"](out, x, w, s, False)
    assert launches == []
    assert calls == [("weight8_to_bf16", (256, 576)), ((576, 256), BF, torch.float32)] * 3 + [
        ("weight8_to_bf16", (232, 576)), ((576, 232), BF, torch.float32)]
    expected = torch.empty_like(out)
    get_backend("ref").linear(expected, x, w, s)
    assert torch.equal(out, expected)

    gate_up = torch.empty(n, 1000, dtype=BF)
    OPS["linear_swiglu"](torch.empty(n, 500, dtype=BF), x, w, s, gate_up, False)
    assert [k.name for k in launches] == ["silu_mul"]
    get_backend("ref").linear(expected, x, w, s)
    assert torch.equal(gate_up, expected.to(BF))

    for rows, settings in ((n - 1, {}), (n, {"int8_cublas_min_rows": n + 1})):
        launches.clear()
        with tuning.experiment(settings):
            OPS["linear"](torch.empty(rows, 1000, dtype=out_dtype), x[:rows], w, s, False)
        assert [k.file for k in launches] == ["gemm.cu"]


@pytest.mark.parametrize("n,library", [(17, "cublaslt"), (256, "cublaslt"), (257, "default")])
def test_bf16_products_past_gemv_cu_run_on_cublaslt_up_to_its_rows(launches, monkeypatch, n,
                                                                    library):
    """bf16 products of wide_max_tokens + 1 .. CUBLASLT_MAX_TOKENS rows (batched decode steps)
    call torch.mm with cuBLASLt preferred, the float32 logits too, larger ones (prefill) with the
    caller's setting; the caller's setting is back afterwards, also when the product fails.
    Experiments' cublaslt_max_tokens 0 leaves every product on the default."""
    blas = torch.backends.cuda.preferred_blas_library  # the fixture's BlasLibrary
    monkeypatch.setattr(linear.torch, "mm", blas.mm)
    x = torch.randn(n, 4096).to(BF)
    w = torch.randn(6144, 4096).to(BF)
    OPS["linear"](torch.empty(n, 6144, dtype=BF), x, w, None, False)
    OPS["linear"](torch.empty(n, 6144, dtype=torch.float32), x, w, None, False)
    assert launches == []
    assert blas.at_mm == [(library, None), (library, torch.float32)] and blas.now == "default"
    with tuning.experiment({"cublaslt_max_tokens": 0}):
        OPS["linear"](torch.empty(n, 6144, dtype=BF), x, w, None, False)
    assert blas.at_mm[-1] == ("default", None)

    def failing_mm(*args, **kwargs):
        raise RuntimeError("CUBLAS_STATUS_ALLOC_FAILED")

    monkeypatch.setattr(linear.torch, "mm", failing_mm)
    with pytest.raises(RuntimeError, match="ALLOC_FAILED"):
        OPS["linear"](torch.empty(n, 6144, dtype=BF), x, w, None, False)
    assert blas.now == "default"


def test_the_cublaslt_notice_stays_off_the_user_s_stderr(launches, monkeypatch, capfd):
    """PyTorch prints a notice on file descriptor 2 the first time a process prefers cuBLASLt;
    the first product's setting keeps it out of the user's output, and descriptor 2 works after."""
    blas = torch.backends.cuda.preferred_blas_library  # the fixture's BlasLibrary

    def noisy(backend=None):
        if backend == "cublaslt":
            os.write(2, b"preferred_blas_library is an experimental feature\n")
        return blas(backend)

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", noisy)
    monkeypatch.setattr(cublas, "_cublaslt_noted", False)
    monkeypatch.setattr(linear.torch, "mm", blas.mm)
    OPS["linear"](torch.empty(32, 6144, dtype=BF), torch.randn(32, 4096).to(BF),
                  torch.randn(6144, 4096).to(BF), None, False)
    os.write(2, b"the user's own line\n")
    err = capfd.readouterr().err
    assert "experimental" not in err and "the user's own line" in err
    assert cublas._cublaslt_noted and blas.at_mm == [("cublaslt", None)] and blas.now == "default"


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_small_weights_run_a_sequence_s_steps_on_gemv_cu_at_every_row_count(launches, int8):
    """A weight under SMALL_WEIGHT_BYTES (SmolLM2's, 576 x 576 and the 2 x 1536 x 576 SwiGLU)
    takes gemv.cu with one token tile and the same defines at 1, 5 and 8 rows."""
    w, s = _weight(576, 576, int8)
    wg, sg = _weight(2 * 1536, 576, int8)
    for n in (1, 5, 8):
        x = torch.randn(n, 576).to(BF)
        OPS["linear"](torch.empty(n, 576, dtype=BF), x, w, s, True)
        OPS["linear_swiglu"](torch.empty(n, 1536, dtype=BF), x, wg, sg,
                             torch.empty(n, 3072, dtype=BF), True)
    assert [(k.file, k.defines["EPILOGUE"]) for k in launches] == [("gemv.cu", 0), ("gemv.cu", 1)] * 3
    assert [k.args[4] for k in launches] == [1, 1, 5, 5, 8, 8]
    assert all(k.defines["NT"] == 1 and k.pdl for k in launches)
    assert launches[0].defines == launches[2].defines == launches[4].defines
    assert launches[1].defines == launches[3].defines == launches[5].defines


def test_int8_gemv_with_k_not_a_multiple_of_16_runs_the_mma_kernel(launches):
    w, s = _weight(2000, 1032, True)
    OPS["linear"](torch.empty(2, 2000, dtype=BF), torch.randn(2, 1032).to(BF), w, s)
    (k,) = launches
    assert (k.file, k.defines["INT8_LOAD"], k.defines["PDL"]) == ("gemv.cu", 8, 1)
    assert k.smem == linear.gemv_smem_bytes(tuning.gemv_heuristic(2000, 1032, True, "none", 0),
                                            1032, True, "none")


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
def test_batch_invariant_steps_take_gemm_invariant_from_its_rows(launches, monkeypatch, int8):
    """Invariance.BATCH: gemv.cu for the weights without an INVARIANT_GEMM_TABLE entry; with one
    (here: the experiment switch, for every weight) gemv.cu up to min_rows - 1 rows, then
    gemm_invariant.cu in one launch (grid.x: blocks of 64 rows) with the gemv.cu build's order
    (PARTS = its warps, RUNS its runs); narrow weights split by run (grid.y: a row tile's runs,
    neighbours in a cluster), SwiGLU's does not. Past 64 rows every weight takes the GEMM."""
    from tileinfer.backend.hookspecs import Invariance

    batch = Invariance.BATCH
    _without_shipped_entries(monkeypatch, (4096, 4096, "none"), (14336, 4096, "swiglu"))
    w, s = _weight(4096, 4096, int8)
    wg, sg = _weight(2 * 14336, 4096, int8)
    x = torch.randn(64, 4096).to(BF)
    OPS["linear"](torch.empty(64, 4096, dtype=BF), x, w, s, batch)
    assert {k.file for k in launches} == {"gemv.cu"}  # no table entry
    monkeypatch.setitem(gemm_invariant.INVARIANT_GEMM_TABLE, (4096, 4096, int8, "none"),
                        {"stages": 3})
    launches.clear()
    OPS["linear"](torch.empty(64, 4096, dtype=BF), x, w, s, batch)
    assert [(k.file, k.defines["STAGES"]) for k in launches] == [("gemm_invariant.cu", 3)]
    monkeypatch.delitem(gemm_invariant.INVARIANT_GEMM_TABLE, (4096, 4096, int8, "none"))
    launches.clear()
    OPS["linear"](torch.empty(65, 4096, dtype=BF), torch.randn(65, 4096).to(BF), w, s, batch)
    assert [(k.file, k.grid[0]) for k in launches] == [("gemm_invariant.cu", 2)]  # no entry
    least = 17
    for n in (least - 1, least, 100):
        launches.clear()
        x = torch.randn(n, 4096).to(BF)
        with tuning.experiment({"invariant_gemm": {"min_rows": least}}):
            OPS["linear"](torch.empty(n, 4096, dtype=BF), x, w, s, batch)
            OPS["linear_swiglu"](torch.empty(n, 14336, dtype=BF), x, wg, sg,
                                 torch.empty(n, 2 * 14336, dtype=BF), batch)
        if n < least:
            assert [k.file for k in launches] == ["gemv.cu"] * 2
            cfg = linear.invariant_gemv_config(4096, 4096, int8, "none", 0,
                                               tuning.mma_token_tiles(n))
            assert launches[0].defines.get("RUNS", 1) == cfg["runs"] > 1
            assert launches[1].defines.get("RUNS", 1) == 1
            continue
        assert [k.file for k in launches] == ["gemm_invariant.cu"] * 2
        assert [(k.args[4], k.grid[0]) for k in launches] == [(n, -(-n // 64))] * 2
        narrow, swiglu = launches
        warps = tuning.gemv_config(4096, 4096, int8, "none", 0, kernel="mma")["warps"]
        runs = gemm_invariant.invariant_runs(4096, 4096, int8, "none", warps)
        assert (narrow.defines["PARTS"], narrow.defines["RUNS"], narrow.defines["SPLIT"]) == (
            warps, runs, 1)
        assert narrow.grid[1] == 4096 // (16 * narrow.defines["ROW_WARPS"]
                                          * narrow.defines["ROW_TILES"]) * runs
        assert narrow.defines["NT"] == tuning.mma_token_tiles(min(n, 64))
        assert (swiglu.defines["RUNS"], swiglu.defines["SPLIT"], swiglu.defines["EPILOGUE"]) == (
            1, 0, 1)
        assert swiglu.grid[1] == 14336 // (16 * swiglu.defines["ROW_WARPS"])
        assert all(k.pdl and k.smem == gemm_invariant.gemm_smem_bytes(
            {"stages": k.defines["STAGES"], "row_warps": k.defines["ROW_WARPS"],
             "row_tiles": k.defines["ROW_TILES"], "stage_steps": k.defines["STAGE_STEPS"],
             "split": bool(k.defines["SPLIT"])}, int8,
            k.defines["INT8_LOAD"], "swiglu" if k.defines["EPILOGUE"] == 1 else "none",
            k.defines["NT"]) for k in launches)


def test_batched_int8_steps_take_gemm_invariant_for_the_table_s_weights(launches, monkeypatch):
    """Outside the batch-invariant mode, an INT8 weight with a BATCHED_GEMM_TABLE entry runs its
    steps of BATCHED_MIN_ROWS..64 rows on gemm_invariant.cu with the entry's settings and parts
    layout; fewer rows, and the weights without an entry, stay on gemv.cu."""
    w, s = _weight(4096, 4096, True)
    wg, sg = _weight(2 * 14336, 4096, True)
    monkeypatch.setattr(gemm_invariant, "BATCHED_GEMM_TABLE", {
        (4096, 4096, True, "none"): {"blocked": True, "stages": 3, "split": False, "row_warps": 8}})
    for n in (gemm_invariant.BATCHED_MIN_ROWS - 1, gemm_invariant.BATCHED_MIN_ROWS, 64):
        launches.clear()
        x = torch.randn(n, 4096).to(BF)
        OPS["linear"](torch.empty(n, 4096, dtype=BF), x, w, s, False)
        OPS["linear_swiglu"](torch.empty(n, 14336, dtype=BF), x, wg, sg,
                             torch.empty(n, 2 * 14336, dtype=BF), False)
        files = [k.file for k in launches]
        if n < gemm_invariant.BATCHED_MIN_ROWS:
            assert files == ["gemv.cu"] * 2
            continue
        assert files == ["gemm_invariant.cu", "gemv.cu"]
        d = launches[0].defines
        assert (d["BLOCKED_PARTS"], d["STAGES"], d["SPLIT"], d["ROW_WARPS"]) == (1, 3, 0, 8)
        assert d["NT"] == tuning.mma_token_tiles(n) and launches[0].args[4] == n
        assert launches[0].grid == (1, 4096 // (16 * 8))  # one block of rows; the row tiles


def test_batched_bf16_steps_take_gemm_invariant_for_the_table_s_weights(launches, monkeypatch):
    """bf16 weights too: a BATCHED_GEMM_TABLE entry sends a batched step of BATCHED_MIN_ROWS..64
    rows (plain, SwiGLU with its epilogue fused, float32 logits) to gemm_invariant.cu in the
    entry's layout (products of neighbouring k here) instead of cuBLAS; 65 rows, and a weight
    without an entry, go to cuBLAS as before."""
    blas = torch.backends.cuda.preferred_blas_library  # the fixture's BlasLibrary
    monkeypatch.setattr(linear.torch, "mm", blas.mm)
    w, wg = torch.randn(4096, 4096).to(BF), torch.randn(2 * 14336, 4096).to(BF)
    other = torch.randn(6144, 4096).to(BF)
    entry = {"nk": True, "blocked": True, "stages": 3, "split": False, "row_warps": 8}
    monkeypatch.setattr(gemm_invariant, "BATCHED_GEMM_TABLE", {
        (4096, 4096, False, "none"): entry, (14336, 4096, False, "swiglu"): entry})
    for n in (gemm_invariant.BATCHED_MIN_ROWS, 64, 65):
        launches.clear()
        blas.at_mm.clear()
        x = torch.randn(n, 4096).to(BF)
        OPS["linear"](torch.empty(n, 4096, dtype=BF), x, w, None, False)
        OPS["linear"](torch.empty(n, 4096, dtype=torch.float32), x, w, None, False)
        OPS["linear_swiglu"](torch.empty(n, 14336, dtype=BF), x, wg, None,
                             torch.empty(n, 2 * 14336, dtype=BF), False)
        OPS["linear"](torch.empty(n, 6144, dtype=BF), x, other, None, False)
        files = [k.file for k in launches]
        if n > 64:
            assert files == ["elementwise.cu"] and len(blas.at_mm) == 4  # silu_mul after mm
            continue
        assert files == ["gemm_invariant.cu"] * 3 and len(blas.at_mm) == 1
        for k in launches:
            d = k.defines
            assert (d["NK_PRODUCTS"], d["BLOCKED_PARTS"], d["STAGES"], d["ROW_WARPS"]) == (
                1, 1, 3, 8)
            assert d["NT"] == tuning.mma_token_tiles(n) and k.args[4] == n
        assert [k.defines["EPILOGUE"] for k in launches] == [0, 0, 1]
        assert [k.defines["OUT_DTYPE"] for k in launches] == ["bf16_t", "float", "bf16_t"]


def _step(q_lens, contexts, heads=32, kv_heads=8, head_dim=128, kind="int8", qk_norm=True):
    n, page = sum(q_lens), 16
    shape = (400, page, kv_heads, head_dim)
    if kind == "bf16":
        cache = LayerKV(torch.empty(shape, dtype=BF), torch.empty(shape, dtype=BF))
    else:
        cache = LayerKV(torch.empty(shape, dtype=torch.int8), torch.empty(shape, dtype=torch.int8),
                        torch.empty(shape[:3]), torch.empty(shape[:3]),
                        torch.ones(kv_heads, head_dim) if kind == "int8-smooth" else None)
    positions = torch.cat([torch.arange(c - q, c) for q, c in zip(q_lens, contexts)]).to(torch.int32)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    step = AttentionStep(positions, positions.long(), cu, torch.tensor(contexts, dtype=torch.int32),
                         torch.zeros(len(q_lens), 400, dtype=torch.int32), max(q_lens), 400 * page)
    norms = (torch.ones(head_dim, dtype=BF),) * 2 if qk_norm else (None, None)
    qk = QKTransform(torch.ones(8192, head_dim // 2), torch.zeros(8192, head_dim // 2), *norms, 1e-6)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * head_dim).to(BF)
    ws = OPS["attention_workspace"](n, heads, head_dim, step.max_context_len, "cpu")
    out, q = torch.empty(n, heads, head_dim, dtype=BF), torch.empty(n, heads, head_dim, dtype=BF)
    return out, q, cache, qkv, qk, step, ws


@pytest.mark.parametrize("kind", ["bf16", "int8", "int8-smooth"])
def test_decode_step_runs_one_fused_kernel(launches, kind):
    out, q, cache, qkv, qk, step, ws = _step([1, 1], [144, 3000], kind=kind)
    OPS["attention_with_inputs"](out, q, cache, qkv, qk, step, 0.088, True, ws)
    (k,) = launches
    assert (k.file, k.extra, k.pdl) == ("attention_decode.cu", attention.DECODE_OPTIONS, True)
    assert k.defines == {"HEAD_DIM": 128, "KV_INT8": int(kind != "bf16"),
                         "SMOOTH": int(kind == "int8-smooth"), "KV_STAGES": 2, "M_TILES": 2,
                         "PDL_TRIGGER": 1, "FUSED_INPUTS": 1, "NORM_DTYPE": "bf16_t"}
    splits = attention.attention_decode_splits(2, 8, ws.shape[2], 0)
    assert splits == 16 and k.grid == (splits, 8, 2)  # 2 blocks per SM over 16 (sequence, kv head)


def test_verify_and_prefill_steps_run_the_two_ops(launches):
    for q_lens, contexts in (([8], [1500]), ([40], [700])):
        out, q, cache, qkv, qk, step, ws = _step(q_lens, contexts)
        OPS["attention_with_inputs"](out, q, cache, qkv, qk, step, 0.088, True, ws)
    assert [(k.file, k.name) for k in launches] == [
        ("kv.cu", "attention_inputs"), ("attention_decode.cu", "attention_decode"),
        ("kv.cu", "attention_inputs"), ("attention.cu", "attention")]
    assert "FUSED_INPUTS" not in launches[1].defines
    assert launches[3].defines == {"HEAD_DIM": 128, "KV_INT8": 1, "SMOOTH": 0, "KV_STAGES": 2}


def test_attention_experiments_reach_the_launch(launches):
    out, q, cache, qkv, qk, step, ws = _step([1], [3000])
    with tuning.experiment({"attention": {"decode_fused_inputs": False}}):
        OPS["attention_with_inputs"](out, q, cache, qkv, qk, step, 0.088, True, ws)
    with tuning.experiment({"attention": {"decode": False}, "pdl": False}):
        OPS["attention"](out, q, cache, step, 0.088, True, ws)
    with tuning.experiment({"attention": {"decode_combine_batch": 32, "splits": 5}}):
        OPS["attention"](out, q, cache, step, 0.088, True, ws)
    assert [(k.file, k.pdl) for k in launches] == [
        ("kv.cu", True), ("attention_decode.cu", True), ("attention.cu", False),
        ("attention_decode.cu", True)]
    assert launches[3].defines["COMBINE_BATCH"] == 32 and launches[3].grid[0] == 5


def test_invariant_attention_splits_take_the_experiment_s_keys(launches, monkeypatch):
    """A batch-invariant step's attention: splits of INVARIANT_SPLIT_KEYS keys from position 0
    (the kernel's SPLIT_KEYS, as many blocks as the longest context needs), or of the
    experiment switch's "invariant_split_keys", which must be a multiple of 64."""
    import dataclasses

    out, q, cache, qkv, qk, step, ws = _step([1, 1], [144, 3000])
    step = dataclasses.replace(step, batch_invariant=True)
    monkeypatch.setattr(attention.INVARIANT_WORKSPACE, "get",
                        lambda device, tokens, heads, splits, head_dim:
                        torch.zeros(tokens, heads, splits, head_dim + 2))
    for keys, splits in ((None, 25), (128, 50), (64, 100)):  # max_context_len 6,400
        launches.clear()
        with tuning.experiment({"attention": {"invariant_split_keys": keys}} if keys else {}):
            OPS["attention"](out, q, cache, step, 0.088, True, ws)
        (k,) = launches
        assert k.file == "attention_decode.cu" and k.defines["SPLIT_KEYS"] == (keys or 256)
        assert k.grid[0] == splits, keys
    with tuning.experiment({"attention": {"invariant_split_keys": 96}}):
        with pytest.raises(ValueError, match="multiple of 64"):
            OPS["attention"](out, q, cache, step, 0.088, True, ws)


def test_sampling(launches):
    seed, counter = torch.tensor([1]), torch.tensor([0])
    logits = torch.randn(2, 128256)
    out = torch.empty(2, dtype=torch.int32)
    OPS["sample_tokens"](out, logits, 0.0, 0, 1.0, seed, counter, None)  # greedy: split argmax
    OPS["sample_tokens"](out, logits, 0.8, 50, 0.9, seed, counter, torch.empty_like(logits))
    OPS["accept_tokens"](out, logits, torch.tensor([3, 4], dtype=torch.int32), None, 0.8, 50, 0.9,
                         seed, counter)
    OPS["sample_per_row"](out, logits, torch.tensor([0.0, 1.25]), torch.tensor([0, 40], dtype=torch.int32),
                          torch.tensor([1.0, 0.9]), torch.tensor([7, 8]), torch.tensor([0, 3]))
    sums = torch.empty(2)
    OPS["sample_tokens_with_sums"](out, sums, logits, 0.0, 0, 1.0, seed, counter)
    assert [(k.name, k.grid) for k in launches] == [
        ("argmax_split", (32, 2)), ("sample", (2,)), ("accept", (2,)), ("sample_per_row", (2,)),
        ("argmax_split", (32, 2))]
    assert all(k.extra == sampling.SAMPLING_OPTIONS for k in launches)
    assert launches[3].args[2] == 128256  # the vocabulary; the per-row tensors after it
    # The plain greedy call adds up nothing; the one with sums hands the kernel its buffers.
    assert launches[0].args[-2:] == (None, None)
    assert launches[4].args[-2] is sums and launches[4].args[-1] is not None


def test_wgmma_runs_the_launches_whose_order_it_keeps(launches, monkeypatch):
    """The "wgmma" launch setting: bf16 weights in contiguous parts of products of neighbouring
    k, with K a multiple of 64, run gemm_wgmma.cu (built for sm_90a) on gemm_invariant.cu's grid
    (token blocks; row tiles of 64 rows a warpgroup x runs), with the weight's parts, runs and
    epilogue (SwiGLU: both matrices' tiles in a block); INT8 weights, the default order and
    other GPUs than Hopper stay on gemm_invariant.cu."""
    from tileinfer.backend.hookspecs import Invariance
    from tileinfer_backend_cuda import compiler

    batch = Invariance.BATCH
    _without_shipped_entries(monkeypatch, (4096, 4096, "none"))
    x = torch.randn(100, 4096).to(BF)
    nk = {"nk": True, "blocked": True, "runs": 4}
    for order, int8, hopper, expected in ((nk, False, True, "gemm_wgmma.cu"),
                                          (nk, True, True, "gemm_invariant.cu"),
                                          ({"runs": 4}, False, True, "gemm_invariant.cu"),
                                          (nk, False, False, "gemm_invariant.cu")):
        monkeypatch.setitem(compiler._arch_by_device, 0, "sm_90" if hopper else "sm_100")
        w, s = _weight(4096, 4096, int8)
        wg, sg = _weight(2 * 4096, 4096, int8)
        launches.clear()
        with tuning.experiment({"invariant_gemm": {"wgmma": True, **order}}):
            OPS["linear"](torch.empty(100, 4096, dtype=BF), x, w, s, batch)
            OPS["linear_swiglu"](torch.empty(100, 4096, dtype=BF), x, wg, sg,
                                 torch.empty(100, 2 * 4096, dtype=BF), batch)
        assert [k.file for k in launches] == [expected] * 2
        if expected != "gemm_wgmma.cu":
            continue
        warps = tuning.gemv_config(4096, 4096, False, "none", 0, kernel="mma")["warps"]
        for k, epilogue, mats in zip(launches, (0, 1), (1, 2)):  # the switch's 4 runs, split
            d = k.defines
            assert k.extra == () and "ARCH_SPECIFIC" in d and d["EPILOGUE"] == epilogue
            assert (d["RUNS"], d["SPLIT"], d["WG"], d["NT"]) == (4, 1, 1, 8) and k.args[4] == 100
            assert k.grid == (2, 4096 // 64 * 4) and k.block == (128,) and k.args[6] == 4096
            assert k.smem == gemm_wgmma.smem_bytes({"row_warps": 4, "split": True,
                                                    "stages": d["STAGES"]}, 8, mats)
        assert launches[0].defines["PARTS"] == warps


def test_wgmma_min_rows_keeps_smaller_launches_on_gemm_invariant(launches, monkeypatch):
    """"wgmma_min_rows": the launches of fewer rows run gemm_invariant.cu with the same settings
    (its build of the order), those of that many rows or more gemm_wgmma.cu."""
    from tileinfer.backend.hookspecs import Invariance
    from tileinfer_backend_cuda import compiler

    _without_shipped_entries(monkeypatch, (4096, 4096, "none"))
    monkeypatch.setitem(compiler._arch_by_device, 0, "sm_90")
    w, _ = _weight(4096, 4096, False)
    switch = {"nk": True, "blocked": True, "runs": 4, "wgmma": True, "wgmma_min_rows": 33,
              "min_rows": 17}
    for n, expected in ((17, "gemm_invariant.cu"), (32, "gemm_invariant.cu"),
                        (33, "gemm_wgmma.cu"), (64, "gemm_wgmma.cu"), (100, "gemm_wgmma.cu")):
        launches.clear()
        with tuning.experiment({"invariant_gemm": switch}):
            OPS["linear"](torch.empty(n, 4096, dtype=BF), torch.randn(n, 4096).to(BF), w, None,
                          Invariance.BATCH)
        assert [k.file for k in launches] == [expected], n
        assert launches[0].defines["RUNS"] == 4 and launches[0].defines["STAGES"] >= 2


def test_token_groups_give_a_wgmma_block_several_groups_of_64_tokens(launches, monkeypatch):
    """"token_groups": a launch of more than 64 rows takes blocks of that many groups of 64
    tokens (a warpgroup each per 64 weight rows; fewer where half as many hold the rows, a block
    would pass 4 warpgroups, or 2 with SwiGLU), with shared memory for all its tokens; launches
    of up to 64 rows keep one group."""
    from tileinfer.backend.hookspecs import Invariance
    from tileinfer_backend_cuda import compiler

    _without_shipped_entries(monkeypatch, (4096, 4096, "none"), (4096, 4096, "swiglu"))
    monkeypatch.setitem(compiler._arch_by_device, 0, "sm_90")
    w, _ = _weight(4096, 4096, False)
    wg, _ = _weight(2 * 4096, 4096, False)
    nk = {"nk": True, "blocked": True, "runs": 4, "wgmma": True, "min_rows": 17}
    for n, warps, groups, swiglu_groups in ((300, 4, 4, 2), (100, 4, 2, 2), (64, 4, 1, 1),
                                            (300, 8, 2, 1)):
        launches.clear()
        with tuning.experiment({"invariant_gemm": {**nk, "token_groups": 4, "row_warps": warps}}):
            x = torch.randn(n, 4096).to(BF)
            OPS["linear"](torch.empty(n, 4096, dtype=BF), x, w, None, Invariance.BATCH)
            OPS["linear_swiglu"](torch.empty(n, 4096, dtype=BF), x, wg, None,
                                 torch.empty(n, 2 * 4096, dtype=BF), Invariance.BATCH)
        assert [k.file for k in launches] == ["gemm_wgmma.cu"] * 2
        for k, g, mats in zip(launches, (groups, swiglu_groups), (1, 2)):
            wgs = warps // 4
            assert k.defines["TG"] == g and k.defines["WG"] == wgs and k.defines["NT"] == 8
            assert k.grid[0] == -(-n // (64 * g)) and k.block == (128 * wgs * g,)
            cfg = {"row_warps": warps, "split": bool(k.defines["SPLIT"]),
                   "stages": k.defines["STAGES"], "token_groups": g}
            assert k.smem == gemm_wgmma.smem_bytes(cfg, 8, mats)
    assert gemm_wgmma.smem_bytes({"row_warps": 4, "split": False, "stages": 3,
                                  "token_groups": 2}, 8) == 3 * (64 + 128) * 128 + 1024


def test_mma_lag_builds_wgmma_with_products_in_flight_from_3_stages(launches, monkeypatch):
    """"mma_lag": gemm_wgmma.cu built with MMA_LAG (a stage's products in flight through the
    next stage's barrier), which needs 3 stages: a launch whose stages come down to 2 to fit
    (or are set so) is built without it."""
    from tileinfer.backend.hookspecs import Invariance
    from tileinfer_backend_cuda import compiler

    _without_shipped_entries(monkeypatch, (4096, 4096, "none"))
    monkeypatch.setitem(compiler._arch_by_device, 0, "sm_90")
    w, _ = _weight(4096, 4096, False)
    nk = {"nk": True, "blocked": True, "runs": 4, "wgmma": True, "min_rows": 17}
    for extra, lag in (({"mma_lag": True, "stages": 4}, 1), ({"mma_lag": True, "stages": 2}, 0),
                       ({"stages": 4}, 0)):
        launches.clear()
        with tuning.experiment({"invariant_gemm": {**nk, **extra}}):
            OPS["linear"](torch.empty(64, 4096, dtype=BF), torch.randn(64, 4096).to(BF), w, None,
                          Invariance.BATCH)
        [k] = launches
        assert k.file == "gemm_wgmma.cu" and k.defines.get("MMA_LAG", 0) == lag
        assert k.defines["STAGES"] == extra["stages"]


def test_wide_settings_replace_a_table_entry_s_in_launches_of_more_than_64_rows(launches,
                                                                             monkeypatch):
    """An INVARIANT_GEMM_TABLE entry's "wide": its launch settings replace the entry's in
    launches of more than 64 rows (a prefill's), the entry's own run the others; an order key
    there is refused (a launch of many rows must keep the order of a launch of few)."""
    from tileinfer.backend.hookspecs import Invariance
    from tileinfer_backend_cuda import compiler

    monkeypatch.setitem(compiler._arch_by_device, 0, "sm_90")
    key = (4096, 4096, False, "none")
    monkeypatch.setitem(invariant_tuning.INVARIANT_ORDER, key,
                        {"blocked": True, "runs": 4, "nk": True})
    entry = {"row_warps": 8, "stages": 4, "split": True, "wgmma": True, "min_rows": 33,
             "wide": {"split": False, "mma_lag": True, "row_warps": 4}}
    monkeypatch.setitem(gemm_invariant.INVARIANT_GEMM_TABLE, key, entry)
    w, _ = _weight(4096, 4096, False)
    for n, split, lag, wg in ((64, 1, 0, 2), (65, 0, 1, 1), (1024, 0, 1, 1)):
        launches.clear()
        OPS["linear"](torch.empty(n, 4096, dtype=BF), torch.randn(n, 4096).to(BF), w, None,
                      Invariance.BATCH)
        [k] = launches
        assert k.file == "gemm_wgmma.cu" and k.defines["RUNS"] == 4, n
        assert (k.defines["SPLIT"], k.defines.get("MMA_LAG", 0), k.defines["WG"]) == (split, lag,
                                                                                     wg), n
        assert k.grid[1] == 4096 // (64 * wg) * (4 if split else 1), n
    monkeypatch.setitem(gemm_invariant.INVARIANT_GEMM_TABLE, key, {**entry, "wide": {"runs": 2}})
    with pytest.raises(ValueError, match="runs"):
        OPS["linear"](torch.empty(100, 4096, dtype=BF), torch.randn(100, 4096).to(BF), w, None,
                      Invariance.BATCH)


def test_producer_warp_runs_gemm_wgmma_ws_beside_its_warpgroups(launches, monkeypatch):
    """"producer_warp" with TMA weights, unsplit: gemm_wgmma_ws.cu, its consumer warpgroups and
    one warp more, two mbarriers a stage, at most 2 warpgroups a block (token groups halved to
    fit), the tokens' tensor map (boxes of a block's tokens) as its last argument; split or
    without TMA the launch stays on gemm_wgmma.cu."""
    from tileinfer.backend.hookspecs import Invariance
    from tileinfer_backend_cuda import compiler
    from tileinfer_backend_cuda.ops import tensor_map

    token_maps = []

    def token_map(x, rows):
        token_maps.append((x.data_ptr(), tuple(x.shape), x.stride(0), rows))
        return [0] * 16

    monkeypatch.setattr(tensor_map, "_encode", lambda w, rows: torch.zeros(16, dtype=torch.int64))
    monkeypatch.setattr(tensor_map, "_maps", {})
    monkeypatch.setattr(tensor_map, "token_map", token_map)
    _without_shipped_entries(monkeypatch, (4096, 4096, "none"))
    monkeypatch.setitem(compiler._arch_by_device, 0, "sm_90")
    w, _ = _weight(4096, 4096, False)
    nk = {"nk": True, "blocked": True, "runs": 4, "wgmma": True, "min_rows": 17,
          "producer_warp": True, "stages": 4}
    for extra, file, wg, tg in (({"tma": True, "split": False, "token_groups": 4}, "ws", 1, 2),
                                ({"tma": True, "split": False, "row_warps": 8,
                                  "token_groups": 2}, "ws", 2, 1),
                                ({"tma": True, "split": False, "stages": 2}, "ws", 1, 1),
                                ({"tma": True, "split": True}, "", 1, 1),
                                ({"split": False}, "", 1, 1)):
        launches.clear()
        token_maps.clear()
        x = torch.randn(300, 4096 + 8).to(BF)[:, :4096]  # a view of rows 4,104 elements apart
        with tuning.experiment({"invariant_gemm": {**nk, **extra}}):
            OPS["linear"](torch.empty(300, 4096, dtype=BF), x, w, None, Invariance.BATCH)
        [k] = launches
        ws = file == "ws"
        assert token_maps == ([(x.data_ptr(), (300, 4096), 4104, 64 * tg)] if ws else []), extra
        assert (k.args[-1] == [0] * 16) == ws
        assert k.file == ("gemm_wgmma_ws.cu" if ws else "gemm_wgmma.cu"), extra
        assert k.defines["WG"] == wg and k.defines.get("TG", 1) == tg, extra
        assert ("SPLIT" in k.defines) != ws and ("MMA_LAG" not in k.defines)
        assert k.block == (128 * wg * tg + (32 if ws else 0),), extra
        assert k.grid == (-(-300 // (64 * tg)), 4096 // (64 * wg) * (4 if extra["split"] else 1))
        stages = extra.get("stages", 4)
        assert k.defines["STAGES"] == stages
        cfg = {"row_warps": 4 * wg, "split": extra["split"], "stages": stages,
               "token_groups": tg, "tma": extra.get("tma", False), "producer_warp": True}
        assert k.smem == gemm_wgmma.smem_bytes(cfg, 8), extra
    ring = 4 * (64 + 128) * 128 + 1024
    assert gemm_wgmma.smem_bytes({"row_warps": 4, "split": False, "stages": 4,
                                  "token_groups": 2, "tma": True, "producer_warp": True},
                                 8) == ring + 2 * 8 * 4


def test_tma_brings_wgmma_s_weights_in_through_their_tensor_map(launches, monkeypatch):
    """The "tma" setting beside "wgmma": gemm_wgmma.cu built with TMA and handed the weight's
    tensor map (ops/tensor_map.py, boxes of its 64 rows a warpgroup), one map a weight and box
    made once, with room for an mbarrier a stage after the shared memory it had; the weight
    pointer still passed; without the setting no map."""
    from tileinfer.backend.hookspecs import Invariance
    from tileinfer_backend_cuda import compiler
    from tileinfer_backend_cuda.ops import tensor_map

    made = []

    def fake_map(w, box_rows):
        made.append((w.data_ptr(), tuple(w.shape), box_rows))
        return torch.zeros(16, dtype=torch.int64)

    monkeypatch.setattr(tensor_map, "_encode", fake_map)
    monkeypatch.setattr(tensor_map, "_maps", {})
    monkeypatch.setitem(compiler._arch_by_device, 0, "sm_90")
    _without_shipped_entries(monkeypatch, (4096, 4096, "none"))
    x = torch.randn(100, 4096).to(BF)
    w, _ = _weight(4096, 4096, False)
    wg, _ = _weight(2 * 4096, 4096, False)
    nk = {"nk": True, "blocked": True, "runs": 4, "wgmma": True}
    for tma in (True, False):
        launches.clear()
        with tuning.experiment({"invariant_gemm": {**nk, "tma": tma, "row_warps": 8}}):
            for _ in range(2):
                OPS["linear"](torch.empty(100, 4096, dtype=BF), x, w, None, Invariance.BATCH)
                OPS["linear_swiglu"](torch.empty(100, 4096, dtype=BF), x, wg, None,
                                     torch.empty(100, 2 * 4096, dtype=BF), Invariance.BATCH)
        assert [k.file for k in launches] == ["gemm_wgmma.cu"] * 4
        for k, weight, mats in zip(launches, (w, wg) * 2, (1, 2) * 2):
            assert k.defines["TMA"] == int(tma) and k.defines["WG"] == 2
            assert k.args[2] is weight and (k.args[3] is not None) == tma
            cfg = {"row_warps": 8, "split": True, "stages": k.defines["STAGES"]}
            assert k.smem == gemm_wgmma.smem_bytes(cfg, 8, mats) + (8 * cfg["stages"] if tma
                                                                       else 0)
    assert made == [(w.data_ptr(), (4096, 4096), 128), (wg.data_ptr(), (8192, 4096), 128)]


def test_a_weight_s_tensor_map_is_its_rows_in_boxes_of_64_k_with_the_128_byte_swizzle(
        monkeypatch):
    """cuTensorMapEncodeTiled's arguments (innermost dimension first): bf16, rank 2, the
    weight's address, dims (K, rows), the row stride in bytes, box (64, box rows), unit element
    strides, no interleave, the 128-byte swizzle, zeros past the edges; the 16 words of the map
    come back as int64 on the weight's device (words past 2**63 wrapped); made once, and refused
    for anything but a contiguous bf16 matrix."""
    from tileinfer_backend_cuda import compiler
    from tileinfer_backend_cuda.ops import tensor_map

    calls = []

    class Enum:
        def __getattr__(self, name):
            return name

    class Driver:
        CUtensorMapDataType = CUtensorMapInterleave = CUtensorMapSwizzle = Enum()
        CUtensorMapL2promotion = CUtensorMapFloatOOBfill = Enum()
        cuuint64_t = cuuint32_t = int

        class CUresult:
            CUDA_SUCCESS = 0

        @staticmethod
        def cuTensorMapEncodeTiled(*args):
            calls.append(args)
            return 0, type("Map", (), {"opaque": [2**64 - 1] + list(range(15))})()

    monkeypatch.setattr(compiler, "_driver", lambda: Driver)
    monkeypatch.setattr(tensor_map, "_maps", {})
    w = torch.zeros(300, 4096, dtype=BF)
    words = tensor_map.weight_map(w, 128)
    assert tensor_map.weight_map(w, 128) is words and len(calls) == 1
    assert calls[0] == ("CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", 2, w.data_ptr(), [4096, 300],
                        [8192], [64, 128], [1, 1], "CU_TENSOR_MAP_INTERLEAVE_NONE",
                        "CU_TENSOR_MAP_SWIZZLE_128B", "CU_TENSOR_MAP_L2_PROMOTION_L2_256B",
                        "CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE")
    assert words.dtype == torch.int64 and words.tolist() == [-1] + list(range(15))
    for wrong in (w.t(), w.float()):  # a map reads rows of contiguous bf16
        with pytest.raises(ValueError, match="contiguous bf16"):
            tensor_map.weight_map(wrong, 128)
    assert len(calls) == 1
