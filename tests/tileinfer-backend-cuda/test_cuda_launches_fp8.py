"""The FP8 linear ops' launches without a GPU (test_cuda_launches.py's recorders): which kernel
takes a step of how many rows, and what gemm_fp8.py hands gemm_wgmma.cu (the GPU conformance
suite then checks the results against the ref backend)."""

from __future__ import annotations

import pytest
import torch
from tileinfer.backend.fp8 import E4M3
from tileinfer.backend.hookspecs import Invariance

from test_cuda_launches import launches  # noqa: F401  (the fixture)
from tileinfer_backend_cuda import compiler
from tileinfer_backend_cuda.ops import (OPS, common, gemm_fp8, gemm_fp8_stream, gemm_wgmma,
                                        linear_fp8, tensor_map, tuning)

BF = torch.bfloat16


@pytest.fixture
def fp8(launches, monkeypatch):  # noqa: F811
    """launches, with linear_fp8.py's quantization recorded too, device 0 Hopper with its FP8
    scratch, tensor maps faked and torch._scaled_mm's calls recorded as ("scaled_mm", rows)."""
    monkeypatch.setattr(linear_fp8, "kernel", gemm_wgmma.kernel)  # the fixture's recorder
    monkeypatch.setattr(linear_fp8, "dev", lambda t: 0)
    monkeypatch.setitem(compiler._arch_by_device, 0, "sm_90")
    monkeypatch.setitem(common.FP8_SCRATCH._by_device, 0,
                        (torch.empty(common.Fp8Scratch.BYTES, dtype=torch.uint8),
                         torch.empty(common.Fp8Scratch.ROWS)))
    monkeypatch.setattr(tensor_map, "_encode", lambda w, rows: torch.zeros(16, dtype=torch.int64))
    monkeypatch.setattr(tensor_map, "_maps", {})
    monkeypatch.setattr(linear_fp8, "_scaled_mm",
                        lambda out, xq, *rest: launches.append(("scaled_mm", xq.shape[0])))
    return launches


def _fp8_weight(rows, k):
    return torch.randn(rows, k).to(E4M3), torch.rand(rows)


def _files(log):
    return [k if isinstance(k, tuple) else k.file for k in log]


@pytest.mark.parametrize("n", [17, 32, 64, 128])
def test_batched_fp8_steps_run_gemm_wgmma_on_e4m3_pairs(fp8, n):
    """More rows than gemv.cu takes (up to the switch's max_tokens): the quantization, then
    gemm_wgmma.cu built with W_FP8, the tokens and the weight as bf16 views of half the width
    (the same bytes), K and the tokens' stride in 2-byte units, a part a PART_K k, the scales
    last; SwiGLU in the kernel's epilogue over the stacked gate and up rows; n32 products up to
    32 rows."""
    x = torch.randn(n, 4096).to(BF)
    w, ws = _fp8_weight(6144, 4096)
    wg, wgs = _fp8_weight(2 * 14336, 4096)
    with tuning.experiment({"fp8_gemm": {"max_tokens": 128}}):
        OPS["linear"](torch.empty(n, 6144, dtype=BF), x, w, ws, False)
        OPS["linear_swiglu"](torch.empty(n, 14336, dtype=BF), x, wg, wgs,
                             torch.empty(n, 2 * 14336, dtype=BF), False)
    assert _files(fp8) == ["fp8_quant.cu", "gemm_wgmma.cu"] * 2
    scratch, scales = common.FP8_SCRATCH.get(0)
    for k, weight, w_scale, epilogue, rows in ((fp8[1], w, ws, 0, 6144),
                                               (fp8[3], wg, wgs, 1, 14336)):
        d = k.defines
        assert d["W_FP8"] == 1 and d["EPILOGUE"] == epilogue and d["PARTS"] == 4096 // 128
        assert d["NT"] == (4 if n <= 32 else 8) and "ARCH_SPECIFIC" in d
        xk, wk = k.args[1], k.args[2]
        assert xk.dtype == BF and xk.shape == (n, 2048) and xk.data_ptr() == scratch.data_ptr()
        assert wk.dtype == BF and wk.shape == (weight.shape[0], 2048)
        assert wk.data_ptr() == weight.data_ptr()
        assert k.args[4:8] == (n, 2048, rows, 2048)
        assert k.args[-2] is w_scale and k.args[-1].data_ptr() == scales.data_ptr()
        assert k.args[-1].shape == (n,)


def test_narrow_weights_split_k_into_runs_until_every_sm_has_a_block(fp8, monkeypatch):
    """The rule, without the table's entries: at 64 rows (one token block) qkv's 96 row tiles in
    2 runs, o's and down's 64 in 4, a cluster each; gate/up's 224 tiles unsplit."""
    monkeypatch.setattr(gemm_fp8, "FP8_GEMM_TABLE", {})
    x, h = torch.randn(64, 4096).to(BF), torch.randn(64, 14336).to(BF)
    for out_rows, inp, weight in ((6144, x, _fp8_weight(6144, 4096)),
                                  (4096, x, _fp8_weight(4096, 4096)),
                                  (4096, h, _fp8_weight(4096, 14336))):
        OPS["linear"](torch.empty(64, out_rows, dtype=BF), inp, *weight, False)
    OPS["linear_swiglu"](torch.empty(64, 14336, dtype=BF), x, *_fp8_weight(2 * 14336, 4096),
                         torch.empty(64, 2 * 14336, dtype=BF), False)
    gemms = [k for k in fp8 if k.file == "gemm_wgmma.cu"]
    assert [(k.defines["RUNS"], k.defines["SPLIT"], k.grid) for k in gemms] == [
        (2, 1, (1, 96 * 2)), (4, 1, (1, 64 * 4)), (4, 1, (1, 64 * 4)), (1, 0, (1, 224))]
    assert gemms[2].defines["PARTS"] == 14336 // 128


def test_other_fp8_steps_keep_their_kernels(fp8):
    """gemv.cu for up to 16 rows and for batch-invariant steps; torch._scaled_mm above
    MAX_TOKENS rows (64), with the kernel not enabled (the switch's comparison), off Hopper, and for
    K that is no multiple of PART_K; the switch's settings reach the launch."""
    w, ws = _fp8_weight(4096, 4096)

    def run(n, invariant=False, k=4096):
        fp8.clear()
        weight = (w, ws) if k == 4096 else _fp8_weight(4096, k)
        OPS["linear"](torch.empty(n, 4096, dtype=BF), torch.randn(n, k).to(BF), *weight,
                      invariant)
        return _files(fp8)

    assert run(16) == ["fp8_quant.cu", "gemv.cu"]
    assert run(64, Invariance.BATCH) == ["fp8_quant.cu", "gemv.cu"]
    assert run(65) == ["fp8_quant.cu", ("scaled_mm", 65)]
    assert run(64, k=4160) == ["fp8_quant.cu", ("scaled_mm", 64)]
    with tuning.experiment({"fp8_gemm": {"enabled": False}}):
        assert run(64) == ["fp8_quant.cu", ("scaled_mm", 64)]
    with tuning.experiment({}):  # as shipped
        assert run(64) == ["fp8_quant.cu", "gemm_wgmma.cu"]
    settings = {"enabled": True, "max_tokens": 256, "runs": 2, "stages": 3}
    with tuning.experiment({"fp8_gemm": settings}):
        assert run(129) == ["fp8_quant.cu", "gemm_wgmma.cu"]
        assert fp8[1].defines["RUNS"] == 2 and fp8[1].defines["STAGES"] == 3
    compiler._arch_by_device[0] = "sm_89"
    assert run(64) == ["fp8_quant.cu", ("scaled_mm", 64)]
    with pytest.raises(ValueError, match="fp8_gemm.tiles"):
        tuning.set_experiments({"fp8_gemm": {"tiles": 2}})


@pytest.mark.parametrize("n,invariant", [(1, True), (64, False), (64, Invariance.BATCH),
                                         (65, False)])
def test_inputs_given_quantized_take_the_plain_ops_product_launches(fp8, n, invariant):
    """linear_e4m3_input / linear_swiglu_e4m3_input (rows add_rmsnorm_e4m3 quantized): the plain
    ops' launches (gemv.cu, gemm_wgmma.cu, torch._scaled_mm and silu_mul), the same builds and
    grids, on the given rows, without the quantization launch."""
    x, x_q, x_scale = torch.randn(n, 4096).to(BF), torch.randn(n, 4096).to(E4M3), torch.rand(n)
    w, wg = _fp8_weight(6144, 4096), _fp8_weight(2 * 14336, 4096)

    def run(linear, swiglu, inputs):
        fp8.clear()
        OPS[linear](torch.empty(n, 6144, dtype=BF), *inputs, *w, invariant)
        OPS[swiglu](torch.empty(n, 14336, dtype=BF), *inputs, *wg,
                    torch.empty(n, 2 * 14336, dtype=BF), invariant)
        return list(fp8)

    plain = run("linear", "linear_swiglu", (x,))
    given = run("linear_e4m3_input", "linear_swiglu_e4m3_input", (x_q, x_scale))
    kept = [k for k in plain if isinstance(k, tuple) or k.file != "fp8_quant.cu"]
    assert len(kept) == len(plain) - 2 and kept

    def described(log):
        return [k if isinstance(k, tuple) else (k.file, k.name, k.defines, k.grid) for k in log]

    assert described(given) == described(kept)
    for k in given:
        if not isinstance(k, tuple) and k.file in ("gemv.cu", "gemm_wgmma.cu"):
            assert k.args[1].data_ptr() == x_q.data_ptr()


def test_gemm_fp8_settings_fit_the_runs_to_the_parts(monkeypatch):
    """The rule's runs: a power of two, at most a cluster, and whole parts each (K = 384: three
    parts, so one run however few blocks)."""
    monkeypatch.setitem(common._device_properties, (0, "multi_processor_count"), 132)
    with tuning.experiment({}):
        assert gemm_fp8.gemm_settings(64, 4096, "none", 64, 0)["runs"] == 8
        assert gemm_fp8.gemm_settings(64, 384, "none", 64, 0)["runs"] == 1
        assert gemm_fp8.gemm_settings(64 * 132, 4096, "none", 64, 0)["runs"] == 1


def test_a_table_entry_replaces_the_rule_and_part_k_sets_the_parts(fp8, monkeypatch):
    """FP8_GEMM_TABLE's settings for a weight reach its launch (two warpgroups: 128 rows a block,
    8 runs); the switch's "part_k" gives K / part_k parts, and a K that is no multiple of it goes
    to torch._scaled_mm."""
    monkeypatch.setitem(gemm_fp8.FP8_GEMM_TABLE, (6144, 4096, "none"),
                        {"row_warps": 8, "runs": 8, "stages": 3})
    x = torch.randn(64, 4096).to(BF)
    OPS["linear"](torch.empty(64, 6144, dtype=BF), x, *_fp8_weight(6144, 4096), False)
    k = fp8[-1]
    assert (k.defines["WG"], k.defines["RUNS"], k.defines["STAGES"]) == (2, 8, 3)
    assert k.grid == (1, 6144 // 128 * 8) and k.block == (256,)
    for part, parts in ((64, 64), (256, 16)):
        with tuning.experiment({"fp8_gemm": {"enabled": True, "part_k": part}}):
            OPS["linear"](torch.empty(64, 6144, dtype=BF), x, *_fp8_weight(6144, 4096), False)
        assert fp8[-1].defines["PARTS"] == parts
    with tuning.experiment({"fp8_gemm": {"enabled": True, "part_k": 256}}):
        OPS["linear"](torch.empty(64, 4096, dtype=BF), torch.randn(64, 384).to(BF),
                      *_fp8_weight(4096, 384), False)
    assert fp8[-1] == ("scaled_mm", 64)


@pytest.fixture
def stream(fp8, monkeypatch):
    """fp8, with gemm_fp8_stream.py's launches recorded and its scratch on device 0."""
    monkeypatch.setattr(gemm_fp8_stream, "kernel", gemm_wgmma.kernel)  # the fixture's recorder
    monkeypatch.setitem(common.STREAM_SCRATCH._by_device, 0,
                        (torch.empty(common.StreamScratch.PARTIALS),
                         torch.zeros(common.StreamScratch.FLAGS, dtype=torch.int32)))
    return fp8


@pytest.mark.parametrize("setting,grid,threads,stages", [
    ({"row_warps": 8}, 132, 256, 8),  # the defaults: 8 stages of (128 rows + 64 tokens) fit
    ({"row_warps": 4, "stream_ctas": 2, "stream_stages": 12}, 264, 128, 6),  # half a SM each
    ({"row_warps": 8, "stream_boxes": 2}, 132, 256, 4)])  # 4 stages of two boxes fit
def test_the_stream_takes_a_grid_of_resident_blocks(stream, setting, grid, threads, stages):
    """With "stream" (up to 64 rows): gemm_fp8_stream.cu on the e4m3 pairs, one block per SM or
    two (the ring then brought down to half a SM's shared memory), K in 2-byte units, the scales,
    then the scratch's partials and flags."""
    x = torch.randn(64, 4096).to(BF)
    w, ws = _fp8_weight(6144, 4096)
    with tuning.experiment({"fp8_gemm": {"stream": True, **setting}}):
        OPS["linear"](torch.empty(64, 6144, dtype=BF), x, w, ws, False)
    assert _files(stream) == ["fp8_quant.cu", "gemm_fp8_stream.cu"]
    k = stream[1]
    assert k.grid == (grid,) and k.block == (threads,) and k.pdl
    boxes = setting.get("stream_boxes", 1)
    assert k.defines["STAGES"] == stages and k.defines["BOXES"] == boxes
    assert k.defines["NT"] == 8 and "ARCH_SPECIFIC" in k.defines
    assert k.smem == gemm_fp8_stream.smem_bytes(stages, boxes, threads // 128, 1, 8)
    assert 2 * k.smem <= 233472 if grid == 264 else k.smem <= 232448
    assert k.args[3:7] == (64, 2048, 6144, 2048)
    partials, flags = common.STREAM_SCRATCH.get(0)
    assert k.args[-4] is ws and k.args[-2] is partials and k.args[-1] is flags


def test_the_stream_steps_aside_where_it_cannot_run(stream, monkeypatch):
    """More than 64 rows, and a grid the partials cannot hold: gemm_wgmma.cu; a weight of fewer
    stages than SMs: a block a stage."""
    w, ws = _fp8_weight(64, 256)

    def run(n):
        stream.clear()
        OPS["linear"](torch.empty(n, 64, dtype=BF), torch.randn(n, 256).to(BF), w, ws, False)
        return stream[1]

    with tuning.experiment({"fp8_gemm": {"stream": True, "max_tokens": 128}}):
        assert run(64).file == "gemm_fp8_stream.cu" and run(64).grid == (2,)  # 1 tile x 2 stages
        assert run(65).file == "gemm_wgmma.cu"
        monkeypatch.setattr(common.StreamScratch, "PARTIALS", 1)
        assert run(64).file == "gemm_wgmma.cu"
