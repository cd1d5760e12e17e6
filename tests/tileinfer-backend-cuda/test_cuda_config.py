"""Launch configuration of the CUDA backend's GEMV and attention (no GPU needed): the per-shape
GEMV tables and their precedence, the choice of kernel family (gemv.cu "mma" / gemv_rows.cu
"rows"), the shared memory each configuration asks for, the rows kernel's split of K and its
independence of the token count, and the benchmark's sweeps staying within what a block may take
on an H200.
"""

from __future__ import annotations

import pytest

from tileinfer_backend_cuda import bench, ops

SMEM_PER_BLOCK = 227 * 1024  # sm_90: the most dynamic shared memory one block may have


@pytest.fixture
def fake_gpu(monkeypatch):
    """An H200-sized device 0 (132 SMs) for the heuristics, clean tables and overrides, and the
    mma kernel family (the tests of the rows family set it themselves)."""
    monkeypatch.setitem(ops._device_properties, (0, "multi_processor_count"), 132)
    monkeypatch.setattr(ops, "GEMV_TABLE", {})
    monkeypatch.setattr(ops, "GEMV_ROWS_TABLE", {})
    monkeypatch.setattr(ops, "GEMV_KERNEL", "mma")
    monkeypatch.setattr(ops, "gemv_overrides", {})
    monkeypatch.setattr(ops, "attention_overrides", {})


def _heuristic(*shape):
    return ops.gemv_heuristic(*shape, 0) | {"l2_256b": False, "kernel": "mma"}


def _rows_heuristic(*shape):
    return ops.gemv_rows_heuristic(*shape, 0) | {"kernel": "rows"}


def test_gemv_table_entry_replaces_the_heuristic(fake_gpu):
    assert ops.gemv_config(6144, 4096, False, "none", 0) == _heuristic(6144, 4096, False, "none")
    ops.GEMV_TABLE[(6144, 4096, False, "none")] = {"warps": 4, "stages": 3}
    assert ops.gemv_config(6144, 4096, False, "none", 0) == {"warps": 4, "stages": 3,
                                                             "l2_256b": False, "kernel": "mma"}
    # other shapes, and the same shape with INT8 weights, keep the heuristic
    assert ops.gemv_config(6144, 4096, True, "none", 0) == _heuristic(6144, 4096, True, "none")
    assert ops.gemv_config(4096, 4096, False, "none", 0) == _heuristic(4096, 4096, False, "none")
    # benchmark overrides win over the table
    ops.gemv_overrides.update({"warps": 16, "stages": 2, "l2_256b": True})
    assert ops.gemv_config(6144, 4096, False, "none", 0) == {"warps": 16, "stages": 2,
                                                             "l2_256b": True, "kernel": "mma"}


def test_gemv_table_entries_do_not_depend_on_the_token_count():
    """The configuration is a function of the weight only (gemv_config takes no token count), so
    a row's sum is the same at 1 and at 8 tokens."""
    import inspect

    assert "n" not in inspect.signature(ops.gemv_config).parameters
    for key, cfg in ops.GEMV_TABLE.items():
        o_rows, k_dim, int8, epilogue = key
        assert epilogue in ops._EPILOGUES and isinstance(int8, bool)
        assert ops.gemv_ring_bytes(cfg | {"l2_256b": False}, k_dim, int8, epilogue) <= bench.GEMV_RING_LIMIT
    for key, cfg in ops.GEMV_ROWS_TABLE.items():
        o_rows, k_dim, int8, epilogue = key
        assert epilogue in ops._EPILOGUES and isinstance(int8, bool)
        _check_rows_config(cfg, o_rows, k_dim, int8, epilogue)


@pytest.mark.parametrize("model", list(bench.MODELS))
@pytest.mark.parametrize("int8", [False, True])
def test_gemv_heuristic_fits_in_shared_memory(fake_gpu, model, int8):
    for name, (rows, cols) in bench.MODELS[model].items():
        epilogue = "swiglu" if name == "gate_up" else "none"
        o_rows = rows // 2 if epilogue == "swiglu" else rows
        cfg = ops.gemv_config(o_rows, cols, int8, epilogue, 0)
        assert ops.gemv_ring_bytes(cfg, cols, int8, epilogue) <= 100 * 1024


def test_gemv_sweep_is_skipped_where_the_ring_does_not_fit():
    for cfg in bench.gemv_configs():
        for int8 in (False, True):
            for epilogue in ("none", "swiglu"):
                ring = ops.gemv_ring_bytes(cfg, 4096, int8, epilogue)
                static = cfg["warps"] * 2 * 16 * 9 * 4  # gemv.cu's partial[][][][] buffer
                if ring <= bench.GEMV_RING_LIMIT:
                    assert ring + static <= SMEM_PER_BLOCK


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("smooth", [False, True])
def test_attention_shared_memory_fits(head_dim, int8, smooth):
    """The default ring depth fits every supported head size; deeper rings fit at 128."""
    assert ops.attention_smem_bytes(head_dim, int8, smooth, ops.ATTN_CONFIG["stages"]) <= 200 * 1024
    if head_dim <= 128:
        for cfg in bench.attention_configs():
            assert ops.attention_smem_bytes(head_dim, int8, smooth, cfg["stages"]) <= 200 * 1024


def test_attention_smem_matches_the_kernel_layout():
    """attention.cu's SharedTiles at HEAD_DIM 128: q 64 x 128 bf16; bf16 pages: K and V per
    stage; int8: bf16 K and V tiles + per stage raw int8 K and V and 64 + 64 float scales."""
    q = 64 * 128 * 2
    assert ops.attention_smem_bytes(128, False, False, 2) == q + 2 * 2 * 64 * 128 * 2
    bf16_tiles, raw_stage = 2 * 64 * 128 * 2, 2 * 64 * 128 + 2 * 64 * 4
    assert ops.attention_smem_bytes(128, True, False, 3) == q + bf16_tiles + 3 * raw_stage
    assert ops.attention_smem_bytes(128, True, True, 2) == 2 * q + bf16_tiles + 2 * raw_stage


def test_attention_config_overrides(fake_gpu):
    assert ops.attention_config() == ops.ATTN_CONFIG
    ops.attention_overrides.update({"stages": 3})
    assert ops.attention_config() == {**ops.ATTN_CONFIG, "stages": 3}


def test_benchmark_precompiles_every_swept_variant_name():
    """The sweep's defines are the ones ops._gemv passes (a mismatch would time a cold compile)."""
    d = bench._gemv_defines({"warps": 4, "stages": 3, "l2_256b": True}, True, "swiglu", "bf16_t")
    assert d == {"W_INT8": 1, "INT8_LOAD": 16, "EPILOGUE": 1, "OUT_DTYPE": "bf16_t",
                 "ROUND_BF16": 0, "WARPS": 4, "STAGES": 3, "STREAM_L2_256B": None}


# --- the row-streaming GEMV (gemv_rows.cu) -------------------------------------------------------

SHAPES = [(name, rows // 2 if name == "gate_up" else rows, cols,
           "swiglu" if name == "gate_up" else "none")
          for shapes in bench.MODELS.values() for name, (rows, cols) in shapes.items()]


def _check_rows_config(cfg, o_rows, k_dim, int8, epilogue):
    """A launchable configuration: legal defines, no idle warps, a split-K that fits the scratch."""
    assert cfg["rows"] in (1, 2, 4, 8) and 1 <= cfg["unroll"] <= 4 and cfg["warps"] in (1, 2, 4, 8)
    splits, k_split = ops.gemv_rows_split(cfg, k_dim, int8)
    steps = -(-k_dim // (32 * ops._rows_lane_k(int8)))
    assert cfg["warps"] * splits <= steps
    assert splits == 1 or ops._GemvScratch.fits(splits, 2 if epilogue == "swiglu" else 1, o_rows)


def test_gemv_kernel_family_and_its_precedence(fake_gpu, monkeypatch):
    shape = (4096, 4096, False, "none")
    assert ops.gemv_config(*shape, 0)["kernel"] == "mma"
    monkeypatch.setattr(ops, "GEMV_KERNEL", "rows")
    assert ops.gemv_config(*shape, 0) == _rows_heuristic(*shape)
    # a table entry replaces the heuristic for its shape only
    ops.GEMV_ROWS_TABLE[shape] = {"rows": 8, "unroll": 1, "warps": 4, "split_k": 2}
    assert ops.gemv_config(*shape, 0) == {"rows": 8, "unroll": 1, "warps": 4, "split_k": 2,
                                          "kernel": "rows"}
    assert ops.gemv_config(4096, 4096, True, "none", 0) == _rows_heuristic(4096, 4096, True, "none")
    # the other family on request, from its own table / heuristic
    assert ops.gemv_config(*shape, 0, kernel="mma") == _heuristic(*shape)
    # overrides: their family is "kernel", else told by their keys; they apply to that family only
    ops.gemv_overrides.update({"warps": 16, "stages": 2})
    assert ops.gemv_config(*shape, 0) == _heuristic(*shape) | {"warps": 16, "stages": 2}
    assert ops.gemv_config(*shape, 0, kernel="rows")["warps"] == 4
    ops.gemv_overrides.clear()
    ops.gemv_overrides.update({"split_k": 1})
    assert ops.gemv_config(*shape, 0) == {"rows": 8, "unroll": 1, "warps": 4, "split_k": 1,
                                          "kernel": "rows"}
    ops.gemv_overrides.clear()
    ops.gemv_overrides.update({"kernel": "mma"})
    assert ops.gemv_config(*shape, 0) == _heuristic(*shape)
    ops.gemv_overrides.update({"kernel": "nope"})
    with pytest.raises(ValueError, match="nope"):
        ops.gemv_config(*shape, 0)


def test_gemv_kernel_default_is_rows_unless_the_environment_says():
    import os
    import subprocess
    import sys

    script = "from tileinfer_backend_cuda import ops; print(ops.GEMV_KERNEL)"
    env = {k: v for k, v in os.environ.items() if k != "TILEINFER_CUDA_GEMV"}
    for value, expected in ((None, "rows"), ("mma", "mma"), ("rows", "rows")):
        run_env = env if value is None else {**env, "TILEINFER_CUDA_GEMV": value}
        r = subprocess.run([sys.executable, "-c", script], env=run_env, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == expected


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("name,o_rows,k_dim,epilogue", SHAPES)
def test_gemv_rows_heuristic_is_launchable(fake_gpu, name, o_rows, k_dim, int8, epilogue):
    cfg = ops.gemv_rows_heuristic(o_rows, k_dim, int8, epilogue, 0)
    _check_rows_config(cfg, o_rows, k_dim, int8, epilogue)
    # 8 weight chunks of 16 bytes per lane and round (the 1-token build's register budget)
    assert (2 if epilogue == "swiglu" else 1) * cfg["rows"] * cfg["unroll"] == 8


@pytest.mark.parametrize("k_dim", [64, 520, 1032, 1040, 2048, 4096, 14336])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("split_k", [1, 2, 3, 4, 8])
def test_gemv_rows_split_covers_k_in_whole_warp_steps(k_dim, int8, split_k):
    if int8 and k_dim % 16:
        pytest.skip("INT8 rows need K % 16 == 0 (others run gemv.cu)")
    splits, k_split = ops.gemv_rows_split({"split_k": split_k}, k_dim, int8)
    step_k = 32 * ops._rows_lane_k(int8)
    assert 1 <= splits <= split_k and k_split % step_k == 0
    assert (splits - 1) * k_split < k_dim <= splits * k_split  # no empty split


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("epilogue", ["none", "swiglu", "xielu"])
def test_gemv_rows_multi_token_build_keeps_every_sum_order(fake_gpu, int8, epilogue):
    """The builds for 1 and for 8 token slots may differ in rows and unroll (registers), never in
    what orders a row's sum: WARPS and the split of K; the launch of a step never depends on n
    beyond choosing the build."""
    for cfg in ({"rows": 4, "unroll": 2, "warps": 2, "split_k": 3},
                {"rows": 8, "unroll": 4, "warps": 1, "split_k": 1},
                {"rows": 1, "unroll": 1, "warps": 8, "split_k": 2}):
        one = ops.gemv_rows_defines(cfg, int8, epilogue, "bf16_t", ops.gemv_rows_tokens(1), True)
        for n in range(2, ops.GEMV_MAX_TOKENS + 1):
            assert ops.gemv_rows_tokens(n) == ops.GEMV_MAX_TOKENS
        many = ops.gemv_rows_defines(cfg, int8, epilogue, "bf16_t", ops.gemv_rows_tokens(8), True)
        assert one["TOKENS"] == 1 and many["TOKENS"] == 8
        assert {k: v for k, v in one.items() if k not in ("ROWS", "UNROLL", "TOKENS")} == \
               {k: v for k, v in many.items() if k not in ("ROWS", "UNROLL", "TOKENS")}
        mats = 2 if epilogue == "swiglu" else 1
        assert mats * many["ROWS"] * many["UNROLL"] <= max(2 if int8 else 4, mats)
        assert (one["ROWS"], one["UNROLL"]) == (cfg["rows"], cfg["unroll"])


@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("name,o_rows,k_dim,epilogue", SHAPES)
def test_gemv_rows_sweep(fake_gpu, name, o_rows, k_dim, int8, epilogue):
    """About 8-12 distinct, launchable configurations a shape, the default among them."""
    configs = bench.gemv_rows_configs(o_rows, k_dim, int8, epilogue, 0)
    assert 6 <= len(configs) <= 14, configs
    keys = [(c["rows"], c["unroll"], c["warps"], c["split_k"]) for c in configs]
    assert len(set(keys)) == len(keys)
    default = ops.gemv_rows_heuristic(o_rows, k_dim, int8, epilogue, 0)
    assert default in configs
    for cfg in configs:
        _check_rows_config(cfg, o_rows, k_dim, int8, epilogue)


def test_gemv_rows_sweep_defines_are_the_launch_defines(fake_gpu):
    """bench precompiles with ops.gemv_rows_defines, the function _gemv_rows launches with."""
    import inspect

    src = inspect.getsource(ops._gemv_rows)
    assert "gemv_rows_defines(" in src and "gemv_rows_tokens(n)" in src
    d = ops.gemv_rows_defines({"rows": 2, "unroll": 4, "warps": 2, "split_k": 2}, True, "swiglu",
                              "bf16_t", 1, True)
    assert d == {"W_INT8": 1, "EPILOGUE": 1, "OUT_DTYPE": "bf16_t", "ROUND_BF16": 0, "ROWS": 2,
                 "UNROLL": 4, "WARPS": 2, "TOKENS": 1, "PDL": 1}


def test_gemv_rows_scratch_capacity_does_not_depend_on_rows_or_tokens():
    # the partials hold 8 token slots whatever n is; a counter per output row bounds every tiling
    assert ops._GemvScratch.fits(8, 1, 4096) and ops._GemvScratch.fits(4, 2, 14336)
    assert not ops._GemvScratch.fits(2, 1, ops._GemvScratch.COUNTERS + 1)
    assert not ops._GemvScratch.fits(64, 2, 4096)


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
    cap = ops.attention_decode_tiles(max_ctx, num_splits, min_tiles)
    assert cap >= 2
    most = max(_decode_block_tiles(ctx, q_len, 4, num_splits, min_tiles)
               for q_len in (1, 2, 5, 8, 16) for ctx in range(q_len, max_ctx + 1, 7))
    assert most <= cap, (most, cap)


def test_variants_hold_the_default_decode_builds():
    """variants.builds (CI's compile test, the warm cache) has the decode attention builds that
    ops launches by default: the default ring depth, fused inputs, every page kind and m-tile count."""
    from tileinfer_backend_cuda import variants

    depth = ops.ATTN_CONFIG["decode_stages"]
    fused = {(d["HEAD_DIM"], d["KV_INT8"], d["SMOOTH"], d["M_TILES"])
             for file, d, _ in variants.builds()
             if file == "attention_decode.cu" and d.get("FUSED_INPUTS") == 1 and d["KV_STAGES"] == depth}
    for head_dim, group in ((64, 4), (128, 4), (128, 1), (256, 2)):
        m_tiles = ops.attention_decode_m_tiles(head_dim, group)
        for kv_int8, smooth in ((0, 0), (1, 0), (1, 1)):
            assert (head_dim, kv_int8, smooth, m_tiles) in fused
