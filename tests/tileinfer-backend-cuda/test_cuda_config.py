"""The CUDA backend's launch configuration and plumbing, without a GPU: the op table against the
contract, the fallback to ref, the benchmark-only switch (TILEINFER_CUDA_EXPERIMENTS), the GEMV
tables and heuristics and their precedence, the shared memory each configuration asks for, the
rows kernel's split of K and its independence of the token count, and the decode attention's
ring depth.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import torch

from tileinfer_backend_cuda import ops
from tileinfer_backend_cuda.ops import (attention, common, gemm_invariant, invariant_tuning, linear,
                                        tuning)

SMEM_PER_BLOCK = 227 * 1024  # sm_90: the most dynamic shared memory one block may have

# (output rows, K, epilogue) of the llama3-8b and llama3.2-1b decode GEMVs
MODEL_SHAPES = {
    "llama3-8b": [(6144, 4096, "none"), (4096, 4096, "none"), (14336, 4096, "swiglu"),
                  (4096, 14336, "none"), (128256, 4096, "none")],
    "llama3.2-1b": [(3072, 2048, "none"), (2048, 2048, "none"), (8192, 2048, "swiglu"),
                    (2048, 8192, "none"), (128256, 2048, "none")],
}
SHAPES = [shape for shapes in MODEL_SHAPES.values() for shape in shapes]


@pytest.fixture
def fake_gpu(monkeypatch):
    """An H200-sized device 0 (132 SMs) for the heuristics, empty rows and mma tables and no
    experiments."""
    monkeypatch.setitem(common._device_properties, (0, "multi_processor_count"), 132)
    monkeypatch.setitem(tuning._pdl_arch, 0, True)  # sm_90: PDL and clusters
    monkeypatch.setattr(tuning, "GEMV_ROWS_TABLE", {})
    monkeypatch.setattr(tuning, "MMA_GEMV_TABLE", {})
    with tuning.experiment({}):
        yield


def _mma(*shape):
    return tuning.gemv_heuristic(*shape, 0) | {"kernel": "mma"}


def _rows(*shape):
    return tuning.gemv_rows_heuristic(*shape, 0) | {"kernel": "rows"}


# --- the op table --------------------------------------------------------------------------------


def test_every_op_of_the_contract_is_implemented_with_its_argument_names():
    from tileinfer.backend import OP_NAMES, OPTIONAL_OPS, hookspecs

    assert set(ops.OPS) == set(OP_NAMES)  # the optional ones too
    assert set(OPTIONAL_OPS) <= set(ops.OPS)
    for name, fn in ops.OPS.items():
        spec = list(inspect.signature(getattr(hookspecs, name)).parameters)
        assert list(inspect.signature(fn).parameters) == spec, name


def test_unsupported_layouts_fall_back_to_ref_and_are_counted():
    from tileinfer.backend import get_backend

    ref = get_backend("ref")
    common.fallback_counts.clear()
    table = torch.randn(10, 6).to(torch.bfloat16)
    ids = torch.tensor([3, 0, 9])  # int64: the kernel takes int32
    out, expected = torch.empty(3, 6, dtype=torch.bfloat16), torch.empty(3, 6, dtype=torch.bfloat16)
    ops.OPS["embed"](out, table, ids)
    ref.embed(expected, table, ids)
    assert torch.equal(out, expected)
    x = torch.randn(6, 4).to(torch.bfloat16).t()  # not contiguous
    w = torch.rand(6).to(torch.bfloat16)
    out, expected = torch.empty(4, 6, dtype=torch.bfloat16), torch.empty(4, 6, dtype=torch.bfloat16)
    ops.OPS["rmsnorm"](out, x, w, 1e-6)
    ref.rmsnorm(expected, x, w, 1e-6)
    assert torch.equal(out, expected)
    assert dict(common.fallback_counts) == {"embed: layout": 1, "rmsnorm: layout": 1}
    common.fallback_counts.clear()


# --- the benchmark-only switch -------------------------------------------------------------------


def test_experiments_default_to_the_shipped_configuration():
    assert tuning._checked(None) == {"gemv": {}, "attention": {}, "pdl": True, "gemv_wide": {},
                                     "small_weight_bytes": None, "cublaslt_max_tokens": None,
                                     "int8_cublas_min_rows": None, "invariant_gemm": {},
                                     "fp8_gemm": {}}
    assert tuning._checked("") == tuning._checked("{}") == tuning._checked({})


def test_experiments_reject_unknown_settings():
    for bad in ({"gemv_kernel": "mma"}, {"gemv": {"rowz": 2}}, {"attention": {"stage": 3}},
                {"gemv_wide": {"fp4": 16}}, {"skinny": {"max_tokens": 64}},
                {"invariant_gemm": {"warps": 8}}):
        with pytest.raises(ValueError, match="unknown settings"):
            tuning.set_experiments(bad)
    assert tuning.experiments == tuning._checked(os.environ.get(tuning.EXPERIMENTS_ENV))


def test_experiment_applies_and_restores(fake_gpu):
    shape = (14336, 4096, False, "none")  # 117 MB: gemv_rows.cu by default
    with tuning.experiment({"gemv": {"kernel": "mma"}, "attention": {"stages": 3}, "pdl": False,
                            "gemv_wide": {"bf16": 32}}):
        assert tuning.gemv_config(*shape, 0) == _mma(*shape)
        assert tuning.attention_config() == {**tuning.ATTN_CONFIG, "stages": 3}
        assert not tuning.experiments["pdl"]
        assert tuning.wide_max_tokens(False) == 32
    assert tuning.gemv_config(*shape, 0) == _rows(*shape)
    assert tuning.attention_config() == tuning.ATTN_CONFIG
    assert tuning.experiments["pdl"]
    assert tuning.wide_max_tokens(False) == tuning.WIDE_MAX_TOKENS["bf16"]


def test_pdl_needs_the_architecture_and_the_switch(monkeypatch):
    monkeypatch.setitem(tuning._pdl_arch, 0, True)
    monkeypatch.setitem(tuning._pdl_arch, 1, False)  # an sm_80 GPU: no griddepcontrol
    with tuning.experiment({}):
        assert tuning.pdl(0) and not tuning.pdl(1)
    with tuning.experiment({"pdl": False}):
        assert not tuning.pdl(0)


def test_experiments_come_from_the_environment():
    script = ("from tileinfer_backend_cuda.ops import tuning; "
              "print(tuning.experiments['gemv'], tuning.experiments['pdl'])")
    env = {k: v for k, v in os.environ.items() if k != tuning.EXPERIMENTS_ENV}
    for value, expected in ((None, "{} True"),
                            ('{"gemv": {"kernel": "mma"}, "pdl": false}', "{'kernel': 'mma'} False")):
        run_env = env if value is None else {**env, tuning.EXPERIMENTS_ENV: value}
        r = subprocess.run([sys.executable, "-c", script], env=run_env, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == expected
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env={**env, tuning.EXPERIMENTS_ENV: '{"gemv": {"kernal": "mma"}}'})
    assert r.returncode != 0 and "gemv.kernal" in r.stderr


# --- decode GEMV configuration -------------------------------------------------------------------


def test_single_sequence_family_by_weight_size_and_table(fake_gpu, monkeypatch):
    """Small weights (streamed in less than a kernel's latency) run a single sequence's steps on
    gemv.cu, large ones on gemv_rows.cu, and GEMV_ROWS_TABLE's shapes on gemv_rows.cu whatever
    their size; the SwiGLU weight counts both matrices, INT8 one byte a weight."""
    limit = tuning.SMALL_WEIGHT_BYTES
    assert tuning.single_sequence_family(576, 576, False, "none") == "mma"  # SmolLM2's o
    assert tuning.single_sequence_family(49152, 576, False, "none") == "rows"  # its lm_head, 57 MB
    assert tuning.single_sequence_family(limit // 2 // 1024, 1024, False, "none") == "mma"
    assert tuning.single_sequence_family(limit // 2 // 1024 + 1, 1024, False, "none") == "rows"
    assert tuning.single_sequence_family(limit // 2 // 1024, 1024, False, "swiglu") == "rows"
    assert tuning.single_sequence_family(limit // 2 // 1024, 1024, True, "swiglu") == "mma"
    with tuning.experiment({"small_weight_bytes": 64 << 20}):
        assert tuning.single_sequence_family(49152, 576, False, "none") == "mma"
    monkeypatch.setitem(tuning.GEMV_ROWS_TABLE, (576, 576, False, "none"), {"rows": 2, "unroll": 1,
                                                                           "warps": 1})
    assert tuning.single_sequence_family(576, 576, False, "none") == "rows"
    assert tuning.gemv_config(576, 576, False, "none", 0)["kernel"] == "rows"
    assert tuning.gemv_config(576, 576, True, "none", 0) == _mma(576, 576, True, "none")


def test_gemv_family_and_its_precedence(fake_gpu, monkeypatch):
    shape = (14336, 4096, False, "none")  # 117 MB: gemv_rows.cu by default
    assert tuning.gemv_config(*shape, 0) == _rows(*shape)
    # a table entry replaces the heuristic for its shape only
    monkeypatch.setitem(tuning.GEMV_ROWS_TABLE, shape, {"rows": 8, "unroll": 1, "warps": 4,
                                                        "split_k": 2})
    entry = {"rows": 8, "unroll": 1, "warps": 4, "split_k": 2, "kernel": "rows"}
    assert tuning.gemv_config(*shape, 0) == entry
    assert tuning.gemv_config(14336, 8192, True, "none", 0) == _rows(14336, 8192, True, "none")
    # the other family on request (INT8 weights with K % 16 != 0), from its heuristic
    assert tuning.gemv_config(*shape, 0, kernel="mma") == _mma(*shape)
    # experiments: their family is "kernel", else told by their keys; they apply to it only
    with tuning.experiment({"gemv": {"warps": 16, "stages": 2}}):
        assert tuning.gemv_config(*shape, 0) == _mma(*shape) | {"warps": 16, "stages": 2}
        assert tuning.gemv_config(*shape, 0, kernel="rows") == entry
    with tuning.experiment({"gemv": {"split_k": 1}}):
        assert tuning.gemv_config(*shape, 0) == entry | {"split_k": 1}
    with tuning.experiment({"gemv": {"kernel": "mma"}}):
        assert tuning.gemv_config(*shape, 0) == _mma(*shape)
    with tuning.experiment({"gemv": {"kernel": "nope"}}):
        with pytest.raises(ValueError, match="nope"):
            tuning.gemv_config(*shape, 0)


def test_gemv_configuration_does_not_depend_on_the_token_count():
    """gemv_config takes no token count (only gemv.cu's token tiles, for batched steps of 9..64
    rows), and every table entry is a launchable configuration."""
    assert "n" not in inspect.signature(tuning.gemv_config).parameters
    for key, cfg in tuning.GEMV_ROWS_TABLE.items():
        o_rows, k_dim, int8, epilogue = key
        assert epilogue in linear.EPILOGUES and isinstance(int8, bool)
        _check_rows_config(cfg, o_rows, k_dim, int8, epilogue)
    wide = {key[:4] + (1,): cfg for key, cfg in tuning.MMA_GEMV_TABLE.items()}
    wide.update(tuning.MMA_GEMV_WIDE_TABLE)
    for (o_rows, k_dim, int8, epilogue, token_tiles), cfg in wide.items():
        assert set(cfg) <= {"warps", "stages", "l2_256b", "tiles", "regs"}
        assert cfg["warps"] in (2, 4, 8, 16) and cfg.get("regs", 0) in (0, 1, 2, 3, 4)
        assert cfg.get("tiles", 1) in (1, 2, 4) and token_tiles in (1, 2, 4, 8)
        smem = linear.gemv_smem_bytes(cfg, k_dim, int8, epilogue, token_tiles)
        assert smem <= SMEM_PER_BLOCK, (o_rows, k_dim, int8, epilogue, token_tiles)


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("o_rows,k_dim,epilogue", SHAPES + [(2000, 1032, "none")])
def test_mma_gemv_heuristic_fits_in_shared_memory(fake_gpu, o_rows, k_dim, int8, epilogue):
    for token_tiles in (1, 2, 4, 8):
        cfg = tuning.gemv_heuristic(o_rows, k_dim, int8, epilogue, 0, token_tiles)
        assert linear.gemv_ring_bytes(cfg, k_dim, int8, epilogue, token_tiles) <= 100 * 1024
        cfg = tuning.gemv_config(o_rows, k_dim, int8, epilogue, 0, kernel="mma",
                                 token_tiles=token_tiles)  # a table's entry, where it has one
        assert linear.gemv_smem_bytes(cfg, k_dim, int8, epilogue, token_tiles) <= SMEM_PER_BLOCK


def _check_rows_config(cfg, o_rows, k_dim, int8, epilogue):
    """A launchable configuration: legal defines, no idle warps, a split-K that fits the scratch."""
    assert cfg["rows"] in (1, 2, 4, 8) and 1 <= cfg["unroll"] <= 4 and cfg["warps"] in (1, 2, 4, 8)
    splits, k_split = tuning.gemv_rows_split(cfg, k_dim, int8)
    steps = -(-k_dim // (32 * tuning.rows_lane_k(int8)))
    assert cfg["warps"] * splits <= steps
    assert splits == 1 or common.GemvScratch.fits(splits, 2 if epilogue == "swiglu" else 1, o_rows)


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("o_rows,k_dim,epilogue", SHAPES)
def test_gemv_rows_heuristic_is_launchable(fake_gpu, o_rows, k_dim, int8, epilogue):
    cfg = tuning.gemv_rows_heuristic(o_rows, k_dim, int8, epilogue, 0)
    _check_rows_config(cfg, o_rows, k_dim, int8, epilogue)
    # 8 weight chunks of 16 bytes per lane and round (the 1-token build's register budget)
    assert (2 if epilogue == "swiglu" else 1) * cfg["rows"] * cfg["unroll"] == 8


@pytest.mark.parametrize("k_dim", [64, 520, 1032, 1040, 2048, 4096, 14336])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("split_k", [1, 2, 3, 4, 8])
def test_gemv_rows_split_covers_k_in_whole_warp_steps(k_dim, int8, split_k):
    if int8 and k_dim % 16:
        pytest.skip("INT8 rows need K % 16 == 0 (others run gemv.cu)")
    splits, k_split = tuning.gemv_rows_split({"split_k": split_k}, k_dim, int8)
    step_k = 32 * tuning.rows_lane_k(int8)
    assert 1 <= splits <= split_k and k_split % step_k == 0
    assert (splits - 1) * k_split < k_dim <= splits * k_split  # no empty split


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("epilogue", ["none", "swiglu", "xielu"])
def test_gemv_rows_multi_token_build_keeps_every_sum_order(int8, epilogue):
    """The builds for 1 to 8 token slots may differ in rows and unroll (registers), never in
    what orders a row's sum: WARPS and the split of K; the launch of a step never depends on n
    beyond choosing the build."""
    for cfg in ({"rows": 4, "unroll": 2, "warps": 2, "split_k": 3},
                {"rows": 8, "unroll": 4, "warps": 1, "split_k": 1},
                {"rows": 1, "unroll": 1, "warps": 8, "split_k": 2}):
        one = linear.gemv_rows_defines(cfg, int8, epilogue, "bf16_t", tuning.gemv_rows_tokens(1), True)
        assert [tuning.gemv_rows_tokens(n) for n in range(1, common.GEMV_MAX_TOKENS + 1)] == \
            [1, 2, 4, 4, 8, 8, 8, 8]
        many = linear.gemv_rows_defines(cfg, int8, epilogue, "bf16_t", tuning.gemv_rows_tokens(8), True)
        assert one["TOKENS"] == 1 and many["TOKENS"] == 8
        assert {k: v for k, v in one.items() if k not in ("ROWS", "UNROLL", "TOKENS")} == \
               {k: v for k, v in many.items() if k not in ("ROWS", "UNROLL", "TOKENS")}
        mats = 2 if epilogue == "swiglu" else 1
        assert mats * many["ROWS"] * many["UNROLL"] <= max(2 if int8 else 4, mats)
        assert (one["ROWS"], one["UNROLL"]) == (cfg["rows"], cfg["unroll"])


def test_gemv_launch_defines():
    """The launches build their defines with these functions (benchmarks/cuda_kernels.py
    precompiles with them too)."""
    src = inspect.getsource(linear._gemv_rows)
    assert "gemv_rows_defines(" in src and "gemv_rows_tokens(n)" in src
    assert "gemv_defines(" in inspect.getsource(linear.gemv_mma)
    assert "gemv_mma(" in inspect.getsource(linear.gemv)
    assert "gemv_mma(" in inspect.getsource(linear.invariant_gemv)
    d = linear.gemv_rows_defines({"rows": 2, "unroll": 4, "warps": 2, "split_k": 2}, True,
                                 "swiglu", "bf16_t", 1, True)
    assert d == {"W_INT8": 1, "EPILOGUE": 1, "OUT_DTYPE": "bf16_t", "ROUND_BF16": 0, "ROWS": 2,
                 "UNROLL": 4, "WARPS": 2, "TOKENS": 1, "PDL": 1}
    d = linear.gemv_defines({"warps": 4, "stages": 3, "l2_256b": True}, True, 8, "xielu",
                            "float", False)
    assert d == {"W_INT8": 1, "INT8_LOAD": 8, "EPILOGUE": 2, "OUT_DTYPE": "float",
                 "ROUND_BF16": 0, "WARPS": 4, "STAGES": 3, "TILES": 1, "NT": 1,
                 "STREAM_L2_256B": None}


def test_gemv_rows_scratch_capacity_does_not_depend_on_rows_or_tokens():
    # the partials hold 8 token slots whatever n is; a counter per output row bounds every tiling
    assert common.GemvScratch.fits(8, 1, 4096) and common.GemvScratch.fits(4, 2, 14336)
    assert not common.GemvScratch.fits(2, 1, common.GemvScratch.COUNTERS + 1)
    assert not common.GemvScratch.fits(64, 2, 4096)


# --- attention -----------------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("smooth", [False, True])
def test_attention_shared_memory_fits(head_dim, int8, smooth):
    """The default ring depth fits every supported head size; a deeper ring fits at 128."""
    depth = tuning.ATTN_CONFIG["stages"]
    assert attention.attention_smem_bytes(head_dim, int8, smooth, depth) <= 200 * 1024
    if head_dim <= 128:
        assert attention.attention_smem_bytes(head_dim, int8, smooth, depth + 1) <= 200 * 1024
    m_tiles = attention.attention_decode_m_tiles(head_dim, 4)
    size = attention.attention_decode_smem_bytes(head_dim, int8, smooth,
                                                 tuning.ATTN_CONFIG["decode_stages"], m_tiles)
    assert size <= SMEM_PER_BLOCK - 1024
    if head_dim <= 128:  # decode_blocks_per_sm = 2 blocks fit on an SM
        assert 2 * (size + 1024) <= 228 * 1024


def test_attention_smem_matches_the_kernel_layout():
    """attention.cu's SharedTiles at HEAD_DIM 128: q 64 x 128 bf16; bf16 pages: K and V per
    stage; int8: bf16 K and V tiles + per stage raw int8 K and V and 64 + 64 float scales."""
    q = 64 * 128 * 2
    assert attention.attention_smem_bytes(128, False, False, 2) == q + 2 * 2 * 64 * 128 * 2
    bf16_tiles, raw_stage = 2 * 64 * 128 * 2, 2 * 64 * 128 + 2 * 64 * 4
    assert attention.attention_smem_bytes(128, True, False, 3) == q + bf16_tiles + 3 * raw_stage
    assert attention.attention_smem_bytes(128, True, True, 2) == 2 * q + bf16_tiles + 2 * raw_stage


def test_attention_workspace_only_where_steps_split():
    ws = attention.attention_workspace(8, 32, 128, 4096, "cpu")
    assert ws.shape == (8, 32, attention.MAX_SPLITS, 130) and ws.dtype == torch.float32
    # the same splits for every cache that can split (row split boundaries never depend on it)
    assert attention.attention_workspace(1, 32, 128, 65, "cpu").shape[2] == attention.MAX_SPLITS
    assert attention.attention_workspace(8, 32, 128, 64, "cpu") is None  # one tile
    assert attention.attention_workspace(attention.SPLIT_MAX_TOKENS + 1, 32, 128, 4096, "cpu") is None


def _decode_block_tiles(ctx, q_len, group, num_splits, min_tiles, m_rows=32):
    """The most key tiles a block of attention_decode.cu loads for one causal step (q_len tokens
    on ctx cached positions, the step's included): the kernel's partition, in Python."""
    def split_keys(c):
        return 64 * max(min_tiles, -(-c // (64 * num_splits)))

    rows, most = q_len * group, 0
    for m0 in range(0, rows, m_rows):
        c_first = ctx - q_len + m0 // group + 1
        c_last = ctx - q_len + (min(rows, m0 + m_rows) - 1) // group + 1
        first, last = split_keys(c_first), split_keys(c_last)
        active = max(1, min(num_splits, -(-c_last // first)))
        for split in range(active):
            a0 = split * first
            a1 = min(c_last, a0 + first)
            b0 = max(a1, split * last)
            b1 = b0 if last == first else max(b0, min(c_last, (split + 1) * last))
            most = max(most, -(-max(0, a1 - a0) // 64) + -(-(b1 - b0) // 64))
    return most


@pytest.mark.parametrize("max_ctx", [64, 304, 1000, 4096])
@pytest.mark.parametrize("num_splits", [1, 4, 33, 64])
@pytest.mark.parametrize("min_tiles", [1, 4])
def test_decode_attention_ring_holds_every_tile_a_block_loads(max_ctx, num_splits, min_tiles):
    """The ring depth cap (attention_decode_tiles) is never below the tiles one block loads, for
    any step of 1..16 tokens on a cache of max_ctx positions, and never below two stages."""
    cap = attention.attention_decode_tiles(max_ctx, num_splits, min_tiles)
    assert cap >= 2
    most = max(_decode_block_tiles(ctx, q_len, 4, num_splits, min_tiles)
               for q_len in (1, 2, 5, 8, 16) for ctx in range(q_len, max_ctx + 1, 7))
    assert most <= cap, (most, cap)


def test_decode_splits_depend_on_batch_heads_and_gpu_only(fake_gpu):
    # one wave of 2 blocks per SM on 132 SMs: 264 // pairs, at least 1, at most MAX_SPLITS
    cases = {(1, 8): 33, (3, 8): 11, (1, 2): 64, (32, 8): 1, (16, 8): 2, (64, 8): 1}
    for (batch, kv_heads), expected in cases.items():
        splits = attention.attention_decode_splits(batch, kv_heads, attention.MAX_SPLITS, 0)
        assert splits == expected, (batch, kv_heads, splits)
    with tuning.experiment({"attention": {"splits": 5}}):
        assert attention.attention_decode_splits(1, 8, attention.MAX_SPLITS, 0) == 5


def test_compile_builds_hold_the_default_decode_builds():
    """cuda_builds (the compile test's builds, the GPU check's warm cache) has the decode
    attention builds the ops launch by default: the default ring depth, fused inputs, every page
    kind and m-tile count."""
    from cuda_builds import builds

    depth = tuning.ATTN_CONFIG["decode_stages"]
    fused = {(d["HEAD_DIM"], d["KV_INT8"], d["SMOOTH"], d["M_TILES"])
             for file, d, _ in builds()
             if file == "attention_decode.cu" and d.get("FUSED_INPUTS") == 1 and d["KV_STAGES"] == depth}
    for head_dim, group in ((64, 4), (128, 4), (128, 1), (256, 2)):
        m_tiles = attention.attention_decode_m_tiles(head_dim, group)
        for kv_int8, smooth in ((0, 0), (1, 0), (1, 1)):
            assert (head_dim, kv_int8, smooth, m_tiles) in fused


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("rows,k_dim,epilogue", SHAPES)
def test_invariant_gemv_builds_keep_the_weights_warps(fake_gpu, monkeypatch, rows, k_dim, epilogue,
                                                      int8):
    """Batch-invariant steps: every token-tile count runs gemv.cu with the weight's parts (what
    orders a row's sum: INVARIANT_ORDER's, else the 8-row build's warps) and its parts' layout
    and runs (INVARIANT_ORDER's, else the defaults), within a block's shared memory."""
    monkeypatch.setitem(common._device_properties, (0, "shared_memory_per_block_optin"),
                        SMEM_PER_BLOCK)
    key = (rows, k_dim, int8, epilogue)
    order = invariant_tuning.INVARIANT_ORDER.get(key, {})
    warps = (order.get("parts")
             or tuning.gemv_config(rows, k_dim, int8, epilogue, 0, kernel="mma")["warps"])
    blocked = order.get("blocked", gemm_invariant.BLOCKED_PARTS)
    fitting = []
    for tiles in (1, 2, 4, 8):
        cfg = linear.invariant_gemv_config(rows, k_dim, int8, epilogue, 0, tiles)
        if cfg is None:  # too many token tiles for these warps: the launches take fewer
            assert tiles > 1
            continue
        fitting.append(tiles)
        assert cfg["warps"] == warps and cfg["kernel"] == "mma"
        assert cfg["runs"] == gemm_invariant.invariant_runs(*key, warps)
        assert warps % cfg["runs"] == 0 and cfg["runs"] == order.get("runs", cfg["runs"])
        assert cfg["blocked"] == blocked
        with tuning.experiment({"invariant_gemm": {"blocked": not blocked}}):
            flipped = linear.invariant_gemv_config(rows, k_dim, int8, epilogue, 0, tiles)
        d = linear.gemv_defines(flipped, int8, linear.int8_load(k_dim), epilogue, "bf16_t", True,
                                tiles)
        assert d.get("BLOCKED_PARTS", 0) == int(not blocked)
        assert gemm_invariant.gemm_defines({"row_warps": 4, "stages": 4, "split": False}, d,
                                           warps, cfg["runs"], tiles).get("BLOCKED_PARTS", 0) == (
            d.get("BLOCKED_PARTS", 0))
        # Interleaved parts in chunks: the same setting reaches both kernels' builds.
        assert cfg["chunk"] == gemm_invariant.PART_CHUNK
        with tuning.experiment({"invariant_gemm": {"blocked": False, "chunk": 4}}):
            chunked = linear.invariant_gemv_config(rows, k_dim, int8, epilogue, 0, tiles)
        d = linear.gemv_defines(chunked, int8, linear.int8_load(k_dim), epilogue, "bf16_t", True,
                                tiles)
        assert d["PART_CHUNK"] == 4 and "BLOCKED_PARTS" not in d
        assert gemm_invariant.gemm_defines({"row_warps": 4, "stages": 4, "split": False}, d,
                                           warps, cfg["runs"], tiles)["PART_CHUNK"] == 4
        # Products of neighbouring k: bf16 only, in both kernels' builds, and never REGS (the
        # fragments come through ldmatrix from the ring).
        assert cfg["nk"] == (order.get("nk", False) and not int8)
        with tuning.experiment({"invariant_gemm": {"nk": True}}):
            nk = linear.invariant_gemv_config(rows, k_dim, int8, epilogue, 0, tiles)
        d = linear.gemv_defines(nk, int8, linear.int8_load(k_dim), epilogue, "bf16_t", True, tiles)
        assert d.get("NK_PRODUCTS", 0) == int(not int8) and ("REGS" not in d or int8)
        assert gemm_invariant.gemm_defines({"row_warps": 4, "stages": 4, "split": False}, d,
                                           warps, cfg["runs"], tiles).get("NK_PRODUCTS", 0) == (
            int(not int8))
        assert linear.gemv_smem_bytes(cfg, k_dim, int8, epilogue, tiles) <= SMEM_PER_BLOCK - 1024
    assert fitting[0] == 1 and fitting == [1, 2, 4, 8][:len(fitting)]


def test_weights_summed_in_one_part_take_the_gemm_at_every_launch_of_many_rows(fake_gpu,
                                                                             monkeypatch):
    """INVARIANT_ORDER's weights in one part (bf16 only: INT8 and FP8 keep their builds' warps)
    run their batch-invariant launches of MIN_ROWS rows or more on gemm_invariant.cu with one
    part and one run (no split of K anywhere), and their 1-row steps on gemv.cu with one warp a
    row tile; an experiment's gemv settings give the 8-row build's warps back."""
    monkeypatch.setitem(common._device_properties, (0, "shared_memory_per_block_optin"),
                        SMEM_PER_BLOCK)
    parts_of = {key: order["parts"] for key, order in invariant_tuning.INVARIANT_ORDER.items()
                if "parts" in order}
    for key, parts in parts_of.items():  # the 1-row build's warps are the order's parts
        assert linear.invariant_gemv_config(*key, 0, 1)["warps"] == parts
    one_part = [key for key, parts in parts_of.items() if parts == 1]
    assert one_part
    for key in one_part:
        rows, k_dim, int8, epilogue = key
        assert not int8
        assert gemm_invariant.takes(*key, gemm_invariant.MIN_ROWS)
        assert gemm_invariant.invariant_runs(*key, 1) == 1
        one_row = linear.invariant_gemv_config(*key, 0, 1)
        assert one_row["warps"] == 1 and one_row["runs"] == 1
        assert linear.invariant_gemv_config(rows, k_dim, True, epilogue, 0, 1)["warps"] == (
            tuning.gemv_config(rows, k_dim, True, epilogue, 0, kernel="mma")["warps"])
        with tuning.experiment({"gemv": {"stages": 4}}):
            assert linear.invariant_gemv_config(*key, 0, 1)["warps"] == tuning.gemv_config(
                *key, 0, kernel="mma")["warps"] > 1


def test_invariant_table_entries_keep_the_weights_warps_and_fit_a_block(fake_gpu, monkeypatch):
    """An INVARIANT_GEMV_TABLE entry gives stages, tiles and row groups, never warps; its groups
    come down until the block has at most 1,024 threads and fits in shared memory."""
    monkeypatch.setitem(common._device_properties, (0, "shared_memory_per_block_optin"),
                        SMEM_PER_BLOCK)
    key = (4096, 14336, False, "none")  # a 16-warp weight
    warps = tuning.gemv_config(*key, 0, kernel="mma")["warps"]
    assert warps == 16
    # its order without products of neighbouring k, which never take REGS
    order = {k: v for k, v in invariant_tuning.INVARIANT_ORDER.get(key, {}).items() if k != "nk"}
    monkeypatch.setitem(invariant_tuning.INVARIANT_ORDER, key, order)
    monkeypatch.setitem(invariant_tuning.INVARIANT_GEMV_TABLE, key + (8,),
                        {"groups": 4, "stages": 2, "tiles": 1, "regs": 2})
    cfg = linear.invariant_gemv_config(*key, 0, 8)
    assert cfg["warps"] == warps and cfg["groups"] == 2 and cfg["regs"] == 2
    monkeypatch.setitem(invariant_tuning.INVARIANT_GEMV_TABLE, key + (8,),
                        {"groups": 2, "stages": 4, "tiles": 2, "l2_256b": True})
    cfg = linear.invariant_gemv_config(*key, 0, 8)
    assert cfg["warps"] == warps
    assert linear.gemv_smem_bytes(cfg, key[1], False, "none", 8) <= SMEM_PER_BLOCK - 1024
    assert linear.gemv_defines(cfg, False, 16, "none", "bf16_t", False, 8).get(
        "GROUPS", 1) == cfg["groups"]


def test_weights_over_4_gb_stay_off_the_gemm(fake_gpu, monkeypatch):
    """gemm_invariant.cu addresses a weight's rows by 32-bit byte offsets: a weight of 4 GB or
    more (a SwiGLU pair counted whole) runs gemv.cu even where a table or the experiment switch
    names it, batch-invariant or batched."""
    big = (262144, 8192, False, "none")  # 4 GB of bf16
    pair = (131072, 8192, False, "swiglu")  # two 2 GB matrices
    small = (131072 - 16, 8192, False, "none")
    assert not gemm_invariant.fits(*big) and not gemm_invariant.fits(*pair)
    assert gemm_invariant.fits(*small) and gemm_invariant.fits(262144, 8192, True, "none")
    assert not gemm_invariant.fits(524288, 8192, True, "none")  # INT8: one byte a weight
    for key in (big, pair, small):
        monkeypatch.setitem(gemm_invariant.INVARIANT_GEMM_TABLE, key, {"split": False})
        monkeypatch.setitem(gemm_invariant.BATCHED_GEMM_TABLE, key, {"split": False})
        expected = key == small
        assert gemm_invariant.takes(*key, 64) is expected
        assert (gemm_invariant.batched_settings(*key, 64) is not None) is expected
        with tuning.experiment({"invariant_gemm": {"min_rows": 17}}):
            assert gemm_invariant.takes(*key, 64) is expected


def test_steps_past_a_block_of_rows_take_the_gemm_for_every_weight(fake_gpu):
    """A batch-invariant step of more than BLOCK_ROWS rows (a prefill) runs gemm_invariant.cu for
    every weight under 4 GB, in the table or not: one launch reads the weight once for all its
    blocks of rows, where gemv.cu would read it once a block."""
    other = (4096, 2048, False, "none")
    assert other not in gemm_invariant.INVARIANT_GEMM_TABLE
    rows = gemm_invariant.BLOCK_ROWS
    assert not gemm_invariant.takes(*other, rows) and gemm_invariant.takes(*other, rows + 1)
    assert gemm_invariant.takes(4096, 14336, True, "swiglu", 4 * rows)
    assert not gemm_invariant.takes(262144, 8192, False, "none", 4 * rows)  # 4 GB


def test_order_experiments_keep_the_tables_routing(fake_gpu):
    """An experiment that sets only the order of the sums (blocked, chunk, runs, nk) leaves which
    launches run gemm_invariant.cu to INVARIANT_GEMM_TABLE (so a step can be timed end to end in
    another order); a launch setting or min_rows sends every weight's launches there."""
    listed = next(k for k, e in gemm_invariant.INVARIANT_GEMM_TABLE.items() if "min_rows" in e)
    least = gemm_invariant.INVARIANT_GEMM_TABLE[listed]["min_rows"]
    other = (4096, 2048, False, "none")
    assert other not in gemm_invariant.INVARIANT_GEMM_TABLE
    for order in ({"nk": True}, {"blocked": True, "runs": 2}, {"chunk": 4}):
        with tuning.experiment({"invariant_gemm": order}):
            assert not gemm_invariant.takes(*other, 64)
            assert gemm_invariant.takes(*listed, least) and not gemm_invariant.takes(*listed,
                                                                                     least - 1)
    for forced in ({"nk": True, "min_rows": 17}, {"stages": 3}):
        with tuning.experiment({"invariant_gemm": forced}):
            assert gemm_invariant.takes(*other, 64) and gemm_invariant.takes(*listed, 17)


def test_invariant_runs_split_narrow_single_matrices_only():
    """The runs of a weight's sum: INVARIANT_ORDER's where they divide its parts, else 4 (or 2)
    for a narrow single matrix whose parts divide into them, 1 for SwiGLU's pair and for wide
    outputs (their row tiles fill the GPU); the experiment switch's before either."""
    def runs(o_rows, epilogue, parts, k_dim=4096):
        return gemm_invariant.invariant_runs(o_rows, k_dim, False, epilogue, parts)

    assert [runs(4096, "none", p) for p in (16, 8, 4, 2, 1)] == [4, 4, 4, 2, 1]
    assert runs(6, "none", 6) == 2 and runs(9, "xielu", 3) == 1
    assert runs(14336, "swiglu", 8) == runs(128256, "none", 8) == 1
    assert runs(gemm_invariant.NARROW_ROWS, "none", 8) == 4
    assert runs(gemm_invariant.NARROW_ROWS + 1, "none", 8) == 1
    ordered = {k: o["runs"] for k, o in invariant_tuning.INVARIANT_ORDER.items() if "runs" in o}
    assert ordered
    for (o_rows, k_dim, int8, epilogue), count in ordered.items():
        assert gemm_invariant.invariant_runs(o_rows, k_dim, int8, epilogue, 16) == count
        assert gemm_invariant.invariant_runs(o_rows, k_dim, int8, epilogue, 3) == 1
    with tuning.experiment({"invariant_gemm": {"runs": 2}}):
        assert runs(128256, "none", 8) == 2 and runs(4096, "none", 3) == 1


@pytest.mark.parametrize("int8", [False, True], ids=["bf16", "int8"])
@pytest.mark.parametrize("rows,k_dim,epilogue", SHAPES)
def test_invariant_gemm_launches_fit_and_split_only_with_runs(fake_gpu, monkeypatch, rows, k_dim,
                                                              epilogue, int8):
    """gemm_invariant.cu's launch at 17..64 rows fits a block's shared memory (the ring, and a
    split launch's sums after it); it splits by run only where the weight has 2..MAX_CLUSTER
    runs, and only on sm_90 (clusters)."""
    monkeypatch.setitem(common._device_properties, (0, "shared_memory_per_block_optin"),
                        SMEM_PER_BLOCK)
    monkeypatch.setattr(gemm_invariant, "INVARIANT_GEMM_TABLE", {})
    parts = tuning.gemv_config(rows, k_dim, int8, epilogue, 0, kernel="mma")["warps"]
    runs = gemm_invariant.invariant_runs(rows, k_dim, int8, epilogue, parts)
    load = linear.int8_load(k_dim)
    for n in (17, 64):
        tiles = tuning.mma_token_tiles(n)
        cfg = gemm_invariant.gemm_config(rows, k_dim, int8, epilogue, runs, n, load, tiles, 0)
        assert gemm_invariant.gemm_smem_bytes(cfg, int8, load, epilogue, tiles) <= (
            SMEM_PER_BLOCK - 1024)
        assert cfg["split"] == (runs > 1)  # the llama shapes' narrow row tiles are few
        base = linear.gemv_defines({"warps": parts, "stages": 2}, int8, load, epilogue,
                                   "bf16_t", True, tiles)
        d = gemm_invariant.gemm_defines(cfg, base, parts, runs, tiles, k_dim)
        assert (d["PARTS"], d["RUNS"], d["NT"], d["SPLIT"], d["PDL"]) == (
            parts, runs, tiles, int(runs > 1), 1)
        step_k = 4 * (load if int8 else 8)  # a K step: 4 lanes' chunks
        assert d.get("K_ALIGNED", 0) == int(k_dim % step_k == 0)
        ragged = gemm_invariant.gemm_defines(cfg, base, parts, runs, tiles, k_dim + 8)
        assert "K_ALIGNED" not in ragged  # K 8 past a step: its last step part empty
        if cfg["split"]:
            mats = 2 if epilogue == "swiglu" else 1
            assert gemm_invariant.gemm_smem_bytes(cfg, int8, load, epilogue, tiles) >= (
                mats * 8 * tiles * gemm_invariant.block_rows(cfg) * 4)
    many = gemm_invariant.MAX_CLUSTER * 2
    assert not gemm_invariant.gemm_config(rows, k_dim, int8, epilogue, many, 64, load, 8, 0)[
        "split"]
    monkeypatch.setitem(tuning._pdl_arch, 0, False)  # an sm_80 GPU: no clusters
    assert not gemm_invariant.gemm_config(rows, k_dim, int8, epilogue, runs, 64, load, 8, 0)[
        "split"]
    with tuning.experiment({"invariant_gemm": {"split": False, "row_warps": 8, "stages": 3}}):
        cfg = gemm_invariant.gemm_config(rows, k_dim, int8, epilogue, runs, 64, load, 8, 0)
    assert (cfg["split"], cfg["row_warps"]) == (False, 8) and cfg["stages"] <= 3
    with tuning.experiment({"invariant_gemm": {"row_tiles": 2}}):
        cfg = gemm_invariant.gemm_config(rows, k_dim, int8, epilogue, runs, 64, load, 8, 0)
    assert cfg["row_tiles"] == (1 if epilogue == "swiglu" else 2)
    assert gemm_invariant.block_rows(cfg) == 16 * cfg["row_warps"] * cfg["row_tiles"]
    assert gemm_invariant.gemm_smem_bytes(cfg, int8, load, epilogue, 8) <= SMEM_PER_BLOCK - 1024
