"""gemv.cu's builds for batch-invariant steps (``Invariance.BATCH``), per weight shape and token
tiles: stages, tiles, regs and row groups (GROUPS) only, since the warps that split K (the parts
of a row's sum) are fixed per weight at every row count: INVARIANT_ORDER's, else the weight's own
8-row build's (ops/linear.py invariant_gemv_config reads them). And the builds of FP8 weights,
whose every step runs gemv.cu's FP8 build on one configuration per weight, warps included."""

from __future__ import annotations

# The winners of `benchmarks/batched_linear.py --mma-sweep N --invariant` (llama3-8b bf16,
# benchmarks/RESULTS.md, 2026-12-03, "Row groups in gemv.cu for batch-invariant steps"); other
# shapes get the batched table's or gemv_heuristic's stages and tiles.
INVARIANT_GEMV_TABLE: dict[tuple[int, int, bool, str, int], dict] = {
    # K in one part (INVARIANT_ORDER's then): `--mma-sweep 1 --mma-warps 1,2 --mma-stages 4,8,12
    # --mma-groups 2,4,8` (H100, benchmarks/RESULTS.md, 2026-12-06, "K in one part"); gate/up's
    # 4 parts run on the same settings
    (14336, 4096, False, 'swiglu', 1): {'groups': 4, 'stages': 12, 'tiles': 1, 'l2_256b': True},
    (128256, 4096, False, 'none', 1): {'groups': 4, 'stages': 12, 'tiles': 1, 'l2_256b': True},
    (14336, 4096, False, 'swiglu', 2): {'groups': 4, 'stages': 12, 'tiles': 1, 'l2_256b': True},
    (128256, 4096, False, 'none', 2): {'groups': 4, 'stages': 12, 'tiles': 1, 'l2_256b': True},
    (6144, 4096, False, 'none', 4): {'groups': 1, 'stages': 2, 'tiles': 1, 'l2_256b': True},
    (4096, 4096, False, 'none', 4): {'groups': 1, 'stages': 4, 'tiles': 2, 'l2_256b': True},
    (14336, 4096, False, 'swiglu', 4): {'groups': 2, 'stages': 2, 'tiles': 2, 'l2_256b': True},
    (4096, 14336, False, 'none', 4): {'groups': 1, 'stages': 2, 'tiles': 2, 'l2_256b': True},
    (128256, 4096, False, 'none', 4): {'groups': 2, 'stages': 3, 'tiles': 2, 'l2_256b': True},
    (6144, 4096, False, 'none', 8): {'groups': 1, 'stages': 2, 'tiles': 4, 'l2_256b': True},
    (4096, 4096, False, 'none', 8): {'groups': 1, 'stages': 3, 'tiles': 2, 'l2_256b': True},
    (4096, 14336, False, 'none', 8): {'groups': 1, 'stages': 2, 'tiles': 2, 'regs': 1},
    (128256, 4096, False, 'none', 8): {'groups': 1, 'stages': 3, 'tiles': 4, 'l2_256b': True},
}

# (output rows, K, int8, epilogue) -> the order of a row's sum in batch-invariant steps where it
# is not the default (the 8-row build's warps as parts, interleaved, gemm_invariant.invariant_runs'
# runs): "parts" (1: K in order, one sum: the order of a GEMM without a split of K) for the wide
# weights whose 1-row step keeps the GPU busy without splitting K, so that gemm_invariant.cu's
# launches of many rows read along the rows as fast as cuBLAS, for a slightly slower 1-row step
# (llama3-8b's lm_head; benchmarks/RESULTS.md, 2026-12-06, "K in one part"; in 2 or 4
# contiguous parts its model step was no faster: 2026-12-06 (late evening), "batch 1's order");
# "blocked" (contiguous parts) and "runs" for narrow weights whose split launches on
# gemm_invariant.cu beat gemv.cu at 64 rows, a contiguous range of K a block, while gemv.cu's
# 1-row step keeps its speed (llama3-8b's qkv and down; benchmarks/RESULTS.md, 2026-12-06
# (late), "a cluster a row tile"); "nk" (bf16: products of neighbouring k, gemv_nk.cuh) for qkv
# and down, whose GEMM it speeds at 64 rows at no cost to their 1-row steps, with 4 runs
# (benchmarks/RESULTS.md, 2026-12-06 (final), "products of neighbouring k"); o (contiguous parts,
# products of neighbouring k, 4 runs) and gate/up (4 contiguous parts of products of neighbouring
# k) take orders gemm_wgmma.cu keeps, whose 64-row launches beat gemm_invariant.cu's and gemv.cu's
# by more than their 1-row steps lose (benchmarks/RESULTS.md, 2026-12-06 (night), "wgmma at 64
# rows"); gate/up's 4 parts sped the model's batch-1 step at the same batch-64 speed, where one
# part had slowed its 1-row step (2026-12-06 (late evening), "batch 1's order").
INVARIANT_ORDER: dict[tuple[int, int, bool, str], dict] = {
    (14336, 4096, False, 'swiglu'): {'parts': 4, 'blocked': True, 'nk': True},
    (128256, 4096, False, 'none'): {'parts': 1},
    (6144, 4096, False, 'none'): {'blocked': True, 'runs': 4, 'nk': True},
    (4096, 4096, False, 'none'): {'blocked': True, 'runs': 4, 'nk': True},
    (4096, 14336, False, 'none'): {'blocked': True, 'runs': 4, 'nk': True},
}


# The settings of an INVARIANT_GEMM_TABLE entry (ops/gemm_invariant.py) and of the experiment
# switch's "invariant_gemm" (ops/tuning.py): how a launch runs (those a "wide" entry may replace),
# the order of a row's sum (INVARIANT_ORDER's keys besides "parts"), and which launches it takes.
INVARIANT_GEMM_LAUNCH_KEYS = frozenset({"row_warps", "row_tiles", "stages", "stage_steps",
                                        "split", "l2_256b", "wgmma", "tma", "token_groups",
                                        "mma_lag", "producer_warp"})
ORDER_KEYS = frozenset({"blocked", "chunk", "runs", "nk"})
INVARIANT_GEMM_KEYS = (INVARIANT_GEMM_LAUNCH_KEYS | ORDER_KEYS
                       | {"min_rows", "wgmma_min_rows", "wide"})


def invariant_order(o_rows: int, k_dim: int, int8: bool, epilogue: str) -> dict:
    """The weight's INVARIANT_ORDER entry ({} where it keeps the default order)."""
    return INVARIANT_ORDER.get((o_rows, k_dim, bool(int8), epilogue), {})


# FP8 weights (ops/linear_fp8.py), per (output rows, K, epilogue): the winners of
# `benchmarks/batched_linear.py --fp8 --mma-sweep 1` (llama3-8b, benchmarks/RESULTS.md,
# 2026-12-03, "FP8 weights on cuda"); at more token tiles invariant_gemv_config lowers row
# groups, stages and tiles until a block fits. Other shapes get the INT8 entries'.
FP8_GEMV_TABLE: dict[tuple[int, int, str], dict] = {
    (6144, 4096, 'none'): {'warps': 16, 'stages': 3, 'tiles': 4, 'l2_256b': True},
    (4096, 4096, 'none'): {'warps': 16, 'stages': 2, 'tiles': 1, 'l2_256b': True},
    (14336, 4096, 'swiglu'): {'warps': 4, 'stages': 3, 'tiles': 1, 'l2_256b': True},
    (4096, 14336, 'none'): {'warps': 16, 'stages': 4, 'tiles': 1, 'l2_256b': True},
}

# gemm_fp8.py's settings (the launch's, and which steps it takes), as the experiment switch's
# "fp8_gemm" may give them (ops/tuning.py).
FP8_GEMM_KEYS = frozenset({"row_warps", "stages", "runs", "tma", "mma_lag", "token_groups",
                           "l2_256b", "max_tokens", "enabled", "part_k", "stream",
                           "stream_stages", "stream_ctas", "stream_boxes"})
