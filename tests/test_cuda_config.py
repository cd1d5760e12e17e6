"""Launch configuration of the CUDA backend's GEMV and attention (no GPU needed): the per-shape
GEMV table and its precedence, the shared memory each configuration asks for, and the
benchmark's sweeps staying within what a block may take on an H200.
"""

from __future__ import annotations

import pytest

from tileinfer_backend_cuda import bench, ops

SMEM_PER_BLOCK = 227 * 1024  # sm_90: the most dynamic shared memory one block may have


@pytest.fixture
def fake_gpu(monkeypatch):
    """An H200-sized device 0 (132 SMs) for the heuristic, and clean tables and overrides."""
    monkeypatch.setitem(ops._sm_counts, 0, 132)
    monkeypatch.setattr(ops, "GEMV_TABLE", {})
    monkeypatch.setattr(ops, "gemv_overrides", {})
    monkeypatch.setattr(ops, "attention_overrides", {})


def _heuristic(*shape):
    return ops.gemv_heuristic(*shape, 0) | {"l2_256b": False}


def test_gemv_table_entry_replaces_the_heuristic(fake_gpu):
    assert ops.gemv_config(6144, 4096, False, "none", 0) == _heuristic(6144, 4096, False, "none")
    ops.GEMV_TABLE[(6144, 4096, False, "none")] = {"warps": 4, "stages": 3}
    assert ops.gemv_config(6144, 4096, False, "none", 0) == {"warps": 4, "stages": 3,
                                                             "l2_256b": False}
    # other shapes, and the same shape with INT8 weights, keep the heuristic
    assert ops.gemv_config(6144, 4096, True, "none", 0) == _heuristic(6144, 4096, True, "none")
    assert ops.gemv_config(4096, 4096, False, "none", 0) == _heuristic(4096, 4096, False, "none")
    # benchmark overrides win over the table
    ops.gemv_overrides.update({"warps": 16, "stages": 2, "l2_256b": True})
    assert ops.gemv_config(6144, 4096, False, "none", 0) == {"warps": 16, "stages": 2,
                                                             "l2_256b": True}


def test_gemv_table_entries_do_not_depend_on_the_token_count():
    """The configuration is a function of the weight only (gemv_config takes no token count), so
    a row's sum is the same at 1 and at 8 tokens."""
    import inspect

    assert "n" not in inspect.signature(ops.gemv_config).parameters
    for key, cfg in ops.GEMV_TABLE.items():
        o_rows, k_dim, int8, epilogue = key
        assert epilogue in ops._EPILOGUES and isinstance(int8, bool)
        assert ops.gemv_ring_bytes(cfg | {"l2_256b": False}, k_dim, int8, epilogue) <= bench.GEMV_RING_LIMIT


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
