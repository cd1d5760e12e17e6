"""Launch configurations: the per-shape tables, the heuristics for shapes not in them, and the one
benchmark-only switch that overrides them. Measured figures behind the tables are in
benchmarks/RESULTS.md; the design reasons in docs/cuda-kernels.md. No order of a sum depends on a
step's token count: a row of a speculative verify step must equal the same row of a 1-token step
bit for bit (greedy speculative decoding relies on it).

The switch: ``TILEINFER_CUDA_EXPERIMENTS``, a JSON object read at import (benchmarks and tests
change it with ``set_experiments`` / ``experiment``), with the keys

- ``"gemv"``: decode GEMV settings that replace the tables' for every shape: ``"kernel"``
  (``"rows"``, gemv_rows.cu; ``"mma"``, gemv.cu; the default is per weight,
  ``single_sequence_family``) and that family's keys (rows: rows, unroll, warps, split_k; mma:
  warps, stages, l2_256b, tiles, regs, groups, xreuse);
- ``"attention"``: keys of ``ATTN_CONFIG``, plus ``"splits"`` (a fixed split count),
  ``"decode_m_tiles"`` (1 or 2), ``"invariant_split_keys"`` (batch-invariant splits' keys),
  ``"split_max_tokens"`` (the most rows of a step given a split workspace);
- ``"pdl"``: false launches the decode path without programmatic dependent launch;
- ``"gemv_wide"``: ``{"bf16": N, "int8": N}``, the most rows of a batched step that gemv.cu
  takes with several token tiles, per weight dtype (replacing ``WIDE_MAX_TOKENS``'s);
- ``"small_weight_bytes"``: replaces ``SMALL_WEIGHT_BYTES`` (single_sequence_family);
- ``"cublaslt_max_tokens"``: replaces ``CUBLASLT_MAX_TOKENS`` (0: every cuBLAS product on
  PyTorch's default library);
- ``"int8_cublas_min_rows"``: replaces ``int8_cublas.MIN_ROWS`` (INT8 products on cuBLAS);
- ``"invariant_gemm"``: gemm_invariant.cu's launch settings for every shape (``row_warps``,
  ``row_tiles``, ``stages``, ``stage_steps``, ``split``, ``l2_256b``; gemm_wgmma.py's; ``wide``:
  those of launches of more than 64 rows), ``min_rows`` (the fewest rows of a launch it takes),
  and every weight's order in both kernels: ``blocked`` (contiguous parts), ``chunk`` (parts
  interleaved in chunks of this many K steps), ``runs``, ``nk`` (gemv_nk.cuh);
- ``"fp8_gemm"``: gemm_fp8.py's launch settings for every shape, ``max_tokens`` (the most rows
  it takes) and ``enabled`` (whether it takes any step): FP8_GEMM_KEYS.
"""

from __future__ import annotations

import contextlib
import json
import os

from .. import compiler
from .common import GEMV_MAX_TOKENS, cdiv, num_sms
from .invariant_tuning import FP8_GEMM_KEYS, INVARIANT_GEMM_KEYS

# --- the benchmark-only switch ---------------------------------------------------------------

EXPERIMENTS_ENV = "TILEINFER_CUDA_EXPERIMENTS"
_ROWS_KEYS = frozenset({"rows", "unroll", "split_k"})
_MMA_KEYS = frozenset({"stages", "l2_256b", "tiles", "regs", "groups", "xreuse"})
_GEMV_KEYS = _ROWS_KEYS | _MMA_KEYS | {"kernel", "warps"}

# attention.cu: "blocks_per_sm" (split-KV target: splits are added until the grid has about this
# many blocks per SM), "stages" (K/V ring depth). attention_decode.cu: "decode_blocks_per_sm",
# "decode_stages" (0: the deepest ring that fits, attention.attention_decode_stages),
# "decode_pdl_trigger" ("start" or "after_loop": where its blocks let the next kernel launch),
# "decode_combine_batch" (COMBINE_BATCH: 8, 16 or 32), "decode_min_split_tiles"
# (MIN_SPLIT_TILES). Comparison switches: "decode" (False: decode steps run attention.cu) and
# "decode_fused_inputs" (False: attention_with_inputs runs the two ops' kernels).
# The values: the H200's best per op and end to end (benchmarks/RESULTS.md, 2026-11-30, "attention
# inputs fused into the CUDA decode attention" and "the CUDA INT8 decode attention on int8 tensor
# cores").
ATTN_CONFIG = {"blocks_per_sm": 2, "stages": 2,
               "decode": True, "decode_blocks_per_sm": 2, "decode_stages": 2,
               "decode_pdl_trigger": "after_loop", "decode_fused_inputs": True,
               "decode_combine_batch": 8, "decode_min_split_tiles": 1}
_ATTN_KEYS = {*ATTN_CONFIG, "splits", "decode_m_tiles", "invariant_split_keys", "split_max_tokens"}
# settings of one value (None: the shipped one)
_SCALARS = ("small_weight_bytes", "cublaslt_max_tokens", "int8_cublas_min_rows")


def _checked(settings) -> dict:
    """The experiments of ``settings`` (a dict, a JSON string or None) over the defaults; a
    ValueError names an unknown key."""
    if isinstance(settings, str):
        settings = json.loads(settings) if settings.strip() else {}
    settings = dict(settings or {})
    groups = {"gemv": _GEMV_KEYS, "attention": _ATTN_KEYS, "gemv_wide": WIDE_MAX_TOKENS,
              "invariant_gemm": INVARIANT_GEMM_KEYS, "fp8_gemm": FP8_GEMM_KEYS}  # and their keys
    unknown = set(settings) - {*groups, "pdl", *_SCALARS}
    unknown |= {f"{g}.{k}" for g, keys in groups.items() for k in settings.get(g, {})
                if k not in keys}
    if unknown:
        raise ValueError(f"{EXPERIMENTS_ENV}: unknown settings {sorted(unknown)}")
    return {**{g: dict(settings.get(g, {})) for g in groups},
            "pdl": bool(settings.get("pdl", True)), **{k: settings.get(k) for k in _SCALARS}}


# The most rows of a step that gemv.cu runs with 2, 4 or 8 token tiles of 8, reading the weight
# once, per weight dtype; above, cuBLAS (bf16) or gemm.cu (INT8). (Steps of 2..8 rows of a single
# sequence stay on gemv_rows.cu: batch_invariant.) bf16: cuBLAS from 17 rows, where gemv.cu's
# builds stop beating it. INT8: one read of the weight for all 64 rows beats gemv.cu on 8-row
# pieces (a read per piece) and gemm.cu (prefill tiles).
# Figures: benchmarks/RESULTS.md, 2026-12-01, "What a batched step's linears cost in gemv.cu".
# FP8 (linear_fp8.py): gemv.cu's FP8 build up to this many rows, torch._scaled_mm above.
WIDE_MAX_TOKENS = {"bf16": 16, "int8": 64, "fp8": 16}

experiments: dict = _checked(os.environ.get(EXPERIMENTS_ENV))


def wide_max_tokens(int8: bool, fp8: bool = False) -> int:
    key = "fp8" if fp8 else "int8" if int8 else "bf16"
    return experiments["gemv_wide"].get(key, WIDE_MAX_TOKENS[key])


# bf16 products of wide_max_tokens + 1 .. this many rows (batched decode steps, short prefill
# chunks) run on cuBLASLt instead of PyTorch's default cuBLAS: at 32 rows of llama3-8b the default
# splits K for o and down and adds a reduce kernel after each, cuBLASLt's heuristic does not
# (static batches 32 and 64 gain on the H200: benchmarks/RESULTS.md, 2026-12-02, "Batch 32:
# cuBLASLt for the batched products"). Larger products (prefill) keep the default.
CUBLASLT_MAX_TOKENS = 256


def cublaslt_max_tokens() -> int:
    asked = experiments["cublaslt_max_tokens"]
    return CUBLASLT_MAX_TOKENS if asked is None else int(asked)


def set_experiments(settings=None):
    """Replace the experiments (None or {}: the shipped configuration)."""
    new = _checked(settings)
    experiments.clear()
    experiments.update(new)


@contextlib.contextmanager
def experiment(settings):
    """``with experiment({"gemv": {"kernel": "mma"}}): ...``; the previous ones afterwards."""
    saved = {k: (dict(v) if isinstance(v, dict) else v) for k, v in experiments.items()}
    set_experiments(settings)
    try:
        yield
    finally:
        experiments.clear()
        experiments.update(saved)


_pdl_arch: dict[int, bool] = {}


def sm90(device: int) -> bool:
    """Whether the GPU is sm_90 or newer (griddepcontrol, thread block clusters)."""
    if device not in _pdl_arch:
        _pdl_arch[device] = int(compiler.device_arch(device)[3:].rstrip("af")) >= 90
    return _pdl_arch[device]


def pdl(device: int) -> bool:
    """Programmatic dependent launch (a launch overlaps the kernel before) where the GPU has it."""
    return sm90(device) and experiments["pdl"]


def attention_config() -> dict:
    config = dict(ATTN_CONFIG)
    config.update(experiments["attention"])
    return config


# --- decode GEMV -----------------------------------------------------------------------------

# gemv_rows.cu per weight shape (output rows, K, int8 weights, epilogue; for SwiGLU the output
# rows are the intermediate size) -> rows per warp, unroll, warps (the in-block split of K),
# split_k (the grid's split of K). The winners of `benchmarks/ops.py --only cuda-sweep` on an H200
# (benchmarks/RESULTS.md, 2026-11-30, "the Triton INT8 GEMV's loads, the CUDA split-KV combine",
# "What changed"); other shapes get gemv_rows_heuristic.
GEMV_ROWS_TABLE: dict[tuple[int, int, bool, str], dict] = {
    (6144, 4096, False, 'none'): {'rows': 2, 'unroll': 4, 'warps': 4, 'split_k': 1},
    (4096, 4096, False, 'none'): {'rows': 2, 'unroll': 4, 'warps': 4, 'split_k': 1},
    (14336, 4096, False, 'swiglu'): {'rows': 1, 'unroll': 4, 'warps': 4, 'split_k': 1},
    (4096, 14336, False, 'none'): {'rows': 2, 'unroll': 2, 'warps': 4, 'split_k': 1},
    (128256, 4096, False, 'none'): {'rows': 2, 'unroll': 4, 'warps': 4, 'split_k': 1},
    (6144, 4096, True, 'none'): {'rows': 2, 'unroll': 2, 'warps': 4, 'split_k': 1},
    (4096, 4096, True, 'none'): {'rows': 4, 'unroll': 1, 'warps': 4, 'split_k': 1},
    (14336, 4096, True, 'swiglu'): {'rows': 2, 'unroll': 1, 'warps': 4, 'split_k': 1},
    (4096, 14336, True, 'none'): {'rows': 4, 'unroll': 1, 'warps': 4, 'split_k': 1},
    (128256, 4096, True, 'none'): {'rows': 4, 'unroll': 2, 'warps': 2, 'split_k': 1},
    (3072, 2048, False, 'none'): {'rows': 2, 'unroll': 2, 'warps': 2, 'split_k': 1},
    (2048, 2048, False, 'none'): {'rows': 2, 'unroll': 4, 'warps': 2, 'split_k': 1},
    (8192, 2048, False, 'swiglu'): {'rows': 2, 'unroll': 1, 'warps': 4, 'split_k': 1},
    (2048, 8192, False, 'none'): {'rows': 8, 'unroll': 1, 'warps': 8, 'split_k': 1},
    (128256, 2048, False, 'none'): {'rows': 2, 'unroll': 2, 'warps': 2, 'split_k': 1},
    (3072, 2048, True, 'none'): {'rows': 2, 'unroll': 4, 'warps': 1, 'split_k': 1},
    (2048, 2048, True, 'none'): {'rows': 4, 'unroll': 2, 'warps': 4, 'split_k': 1},
    (8192, 2048, True, 'swiglu'): {'rows': 4, 'unroll': 1, 'warps': 1, 'split_k': 1},
    (2048, 8192, True, 'none'): {'rows': 4, 'unroll': 1, 'warps': 8, 'split_k': 1},
    (128256, 2048, True, 'none'): {'rows': 4, 'unroll': 1, 'warps': 2, 'split_k': 1},
}


# gemv.cu per weight shape -> warps (the in-block split of K), ring stages, the 256-byte L2
# prefetch hint, 16-row tiles a warp: the batched engine's steps of 2..8 rows run it, and INT8
# weights with K % 16 != 0. llama3-8b bf16: the winners at 8 rows of `benchmarks/batched_linear.py
# --mma-sweep 8`, faster in the step than the 1-token winners (benchmarks/RESULTS.md, 2026-12-01,
# "What a batched step's linears cost in gemv.cu"; qkv, o, down and the lm_head renewed by
# "Batch 8: gemv.cu's 8-row table again"); the others: the 1-token sweep of
# `benchmarks/cuda_kernels.py` (2026-11-30, "the Triton INT8 GEMV's loads, the CUDA split-KV
# combine"). Other shapes get gemv_heuristic.
MMA_GEMV_TABLE: dict[tuple[int, int, bool, str], dict] = {
    (6144, 4096, False, 'none'): {'warps': 8, 'stages': 6, 'tiles': 1, 'l2_256b': True},
    (4096, 4096, False, 'none'): {'warps': 8, 'stages': 6, 'tiles': 2, 'l2_256b': True},
    (14336, 4096, False, 'swiglu'): {'warps': 8, 'stages': 2, 'tiles': 1, 'l2_256b': True},
    (4096, 14336, False, 'none'): {'warps': 16, 'stages': 4, 'tiles': 2, 'l2_256b': True},
    (128256, 4096, False, 'none'): {'warps': 8, 'stages': 2, 'tiles': 2, 'l2_256b': True},
    (6144, 4096, True, 'none'): {'warps': 8, 'stages': 2, 'l2_256b': False},
    (4096, 4096, True, 'none'): {'warps': 16, 'stages': 2, 'l2_256b': False},
    (14336, 4096, True, 'swiglu'): {'warps': 8, 'stages': 4, 'l2_256b': True},
    (4096, 14336, True, 'none'): {'warps': 8, 'stages': 4, 'l2_256b': True},
    (128256, 4096, True, 'none'): {'warps': 4, 'stages': 4, 'l2_256b': True},
    (3072, 2048, False, 'none'): {'warps': 8, 'stages': 4, 'l2_256b': True},
    (2048, 2048, False, 'none'): {'warps': 8, 'stages': 4, 'l2_256b': True},
    (8192, 2048, False, 'swiglu'): {'warps': 4, 'stages': 4, 'l2_256b': True},
    (2048, 8192, False, 'none'): {'warps': 16, 'stages': 4, 'l2_256b': True},
    (128256, 2048, False, 'none'): {'warps': 16, 'stages': 4, 'l2_256b': True},
    (3072, 2048, True, 'none'): {'warps': 16, 'stages': 2, 'l2_256b': False},
    (2048, 2048, True, 'none'): {'warps': 16, 'stages': 2, 'l2_256b': False},
    (8192, 2048, True, 'swiglu'): {'warps': 2, 'stages': 3, 'l2_256b': False},
    (2048, 8192, True, 'none'): {'warps': 16, 'stages': 3, 'l2_256b': False},
    (128256, 2048, True, 'none'): {'warps': 4, 'stages': 4, 'l2_256b': True},
}


# gemv.cu at 9..64 rows (token_tiles = 2, 4, 8: 16, 32, 64 token slots) per weight shape and
# token tiles: the winners of `benchmarks/batched_linear.py --mma-sweep 16` (llama3-8b bf16) and
# `--int8 --mma-sweep 64` (benchmarks/RESULTS.md, 2026-12-01, "What a batched step's linears cost
# in gemv.cu"; the bf16 lm_head at 16 rows: the 32-row winner, cuBLAS was as fast); other
# shapes get gemv_heuristic.
MMA_GEMV_WIDE_TABLE: dict[tuple[int, int, bool, str, int], dict] = {
    (6144, 4096, False, 'none', 2): {'warps': 8, 'stages': 4, 'tiles': 1, 'l2_256b': True},
    (4096, 4096, False, 'none', 2): {'warps': 16, 'stages': 3, 'tiles': 2, 'l2_256b': True},
    (14336, 4096, False, 'swiglu', 2): {'warps': 8, 'stages': 2, 'tiles': 1, 'l2_256b': True},
    (4096, 14336, False, 'none', 2): {'warps': 8, 'stages': 6, 'tiles': 2, 'l2_256b': True},
    (128256, 4096, False, 'none', 2): {'warps': 4, 'stages': 2, 'tiles': 4, 'l2_256b': True},
    (6144, 4096, True, 'none', 8): {'warps': 4, 'stages': 2, 'tiles': 2, 'l2_256b': True},
    (4096, 4096, True, 'none', 8): {'warps': 4, 'stages': 3, 'tiles': 2, 'l2_256b': True},
    (14336, 4096, True, 'swiglu', 8): {'warps': 4, 'stages': 2, 'tiles': 2, 'l2_256b': True},
    (4096, 14336, True, 'none', 8): {'warps': 4, 'stages': 3, 'tiles': 2, 'l2_256b': True},
    (128256, 4096, True, 'none', 8): {'warps': 4, 'stages': 2, 'tiles': 4, 'l2_256b': True},
}


def mma_token_tiles(n: int) -> int:
    """gemv.cu's token tiles of 8 for a batched step of n rows: 1, 2, 4 or 8 (n <= 64)."""
    tiles = 1
    while 8 * tiles < n:
        tiles *= 2
    return tiles


def rows_lane_k(int8: bool) -> int:
    """k of one lane's 16-byte weight chunk in gemv_rows.cu (LANE_K); a warp step is 32 of them."""
    return 16 if int8 else 8


def gemv_rows_heuristic(n_rows: int, k_dim: int, int8: bool, epilogue: str, device: int) -> dict:
    """gemv_rows.cu's configuration for a shape not in GEMV_ROWS_TABLE.

    A warp streams `rows` rows (gate and up rows for SwiGLU) with `unroll` steps of 512 bytes a
    row per round: 8 chunks of 16 bytes per lane and round (a 1-token build near 96 registers,
    about 20 resident warps per SM). The parallelism along K (warps of a block, then grid splits)
    doubles while the grid still fits in one wave of ~20 warps per SM and every warp keeps at
    least two rounds of work.
    """
    mats = 2 if epilogue == "swiglu" else 1
    rows, unroll = (2, 2) if mats == 2 else (4, 2)
    steps = cdiv(k_dim, 32 * rows_lane_k(int8))  # warp steps along a row
    tiles = cdiv(n_rows, rows)
    resident = 20 * num_sms(device)
    par = 1
    while par < 16 and tiles * par * 2 <= resident and steps // (par * 2) >= 2 * unroll:
        par *= 2
    warps = min(par, 4)
    return {"rows": rows, "unroll": unroll, "warps": warps, "split_k": par // warps}


def gemv_heuristic(n_rows: int, k_dim: int, int8: bool, epilogue: str, device: int,
                   token_tiles: int = 1) -> dict:
    """gemv.cu's configuration: warps splitting K and ring stages, aiming at about 16 warps per SM
    over the grid, a ring of at most ~100 KB per block (two blocks per SM) and no more stages
    than a warp has steps; one 16-row tile a warp. With 4 or 8 token tiles the x chunks outweigh
    the weight's in a warp step: 4 warps of two 16-row tiles sharing them, two stages (every
    winner of the 64-row INT8 sweep looks so)."""
    if token_tiles >= 4:
        return {"warps": 4, "stages": 2, "tiles": 2, "l2_256b": True}
    lane_k = (16 if k_dim % 16 == 0 else 8) if int8 else 8
    steps = cdiv(k_dim, 4 * lane_k)
    tiles = cdiv(n_rows, 16)
    target_warps = 16 * num_sms(device)
    warps = 4
    while warps < 16 and tiles * warps < target_warps and steps >= 2 * warps * 2:
        warps *= 2
    parts = 2 * (2 if epilogue == "swiglu" else 1) + lane_k // 8 * token_tiles
    stages = 8
    while stages > 2 and warps * stages * parts * 512 > 100 * 1024:
        stages -= 2
    while warps > 2 and warps * stages * parts * 512 > 100 * 1024:  # many token tiles
        warps //= 2
    stages = max(2, min(stages, cdiv(steps, warps) + 1))
    if stages % 2:
        stages += 1
    return {"warps": warps, "stages": stages, "l2_256b": False}


# A single sequence's steps (1..8 rows, the same kernel and configuration at every count) run
# weights of at most this size on gemv.cu unless GEMV_ROWS_TABLE names them: its tensor cores
# take the 8 token columns of a speculative verify step for about the price of one, where
# gemv_rows.cu's CUDA-core work grows with every row: on small layers (SmolLM2-135M's) an 8-row
# step is much cheaper on gemv.cu and a 1-token step slightly dearer; larger weights (those of
# llama3.2-3b) stream faster on gemv_rows.cu at one token. Figures: benchmarks/RESULTS.md,
# 2026-12-01, "Which GEMV runs a single sequence's steps on cuda".
SMALL_WEIGHT_BYTES = 4 << 20


def single_sequence_family(n_rows: int, k_dim: int, int8: bool, epilogue: str) -> str:
    """The GEMV kernel family of a single sequence's steps for a weight: "rows" (gemv_rows.cu)
    for GEMV_ROWS_TABLE's shapes and weights above SMALL_WEIGHT_BYTES, else "mma" (gemv.cu)."""
    if (n_rows, k_dim, bool(int8), epilogue) in GEMV_ROWS_TABLE:
        return "rows"
    mats = 2 if epilogue == "swiglu" else 1
    weight_bytes = mats * n_rows * k_dim * (1 if int8 else 2)
    small = experiments["small_weight_bytes"]
    return "rows" if weight_bytes > (SMALL_WEIGHT_BYTES if small is None else small) else "mma"


def _asked_family(overrides: dict) -> str | None:
    """The kernel family the experiments' GEMV settings ask for: "kernel", else told by their
    keys, else None."""
    if overrides.get("kernel"):
        return overrides["kernel"]
    if _ROWS_KEYS & overrides.keys():
        return "rows"
    if _MMA_KEYS & overrides.keys():
        return "mma"
    return None


def gemv_config(n_rows: int, k_dim: int, int8: bool, epilogue: str, device: int,
                kernel: str | None = None, token_tiles: int = 1) -> dict:
    """The decode GEMV's configuration for an (n_rows, k_dim) weight, its family under "kernel".

    The family: ``kernel``, else the experiments', else single_sequence_family's. rows:
    GEMV_ROWS_TABLE's entry, else gemv_rows_heuristic; mma: MMA_GEMV_TABLE's entry (token_tiles
    > 1, gemv.cu's builds for 9..64 rows of a batched step: MMA_GEMV_WIDE_TABLE's), else
    gemv_heuristic. The experiments' settings replace those of their own family. A single
    sequence's steps (up to 8 rows) take one configuration whatever their token count."""
    overrides = experiments["gemv"]
    asked = _asked_family(overrides)
    kernel = kernel or asked or single_sequence_family(n_rows, k_dim, int8, epilogue)
    if kernel == "rows":
        entry = GEMV_ROWS_TABLE.get((n_rows, k_dim, bool(int8), epilogue))
        config = (dict(entry) if entry is not None
                  else gemv_rows_heuristic(n_rows, k_dim, int8, epilogue, device))
        config.setdefault("split_k", 1)
    elif kernel == "mma":
        key = (n_rows, k_dim, bool(int8), epilogue)
        entry = (MMA_GEMV_TABLE.get(key) if token_tiles == 1
                 else MMA_GEMV_WIDE_TABLE.get(key + (token_tiles,)))
        config = (dict(entry) if entry is not None
                  else gemv_heuristic(n_rows, k_dim, int8, epilogue, device, token_tiles))
    else:
        raise ValueError(f"unknown GEMV kernel family {kernel!r}: 'rows' or 'mma'")
    if asked in (None, kernel):
        config.update(overrides)
    config["kernel"] = kernel
    return config


def gemv_rows_tokens(n: int) -> int:
    """The token slots of the gemv_rows.cu build that runs an n-token step: n rounded up to 1, 2,
    4 or GEMV_MAX_TOKENS (each slot holds registers: a short verify step on a build of many slots
    costs far more than on one sized to it;
    benchmarks/RESULTS.md, 2026-12-01, "the batched engine, pipelined", "Speculative decoding,
    real SmolLM2"); a row's sum is the same in every build."""
    slots = 1
    while slots < n:
        slots *= 2
    return min(slots, GEMV_MAX_TOKENS)


def gemv_rows_tile(cfg: dict, tokens: int, int8: bool, epilogue: str) -> tuple[int, int]:
    """(rows, unroll) of a launch: the configuration's, reduced for builds of several token slots
    (their accumulators and x chunks take the registers) to at most 4 weight chunks a round
    (bf16) or 2 (INT8). Neither changes the order of any sum."""
    rows, unroll = cfg["rows"], cfg["unroll"]
    if tokens > 1:
        mats = 2 if epilogue == "swiglu" else 1
        budget = 2 if int8 else 4
        while mats * rows * unroll > budget and unroll > 1:
            unroll = (unroll + 1) // 2
        while mats * rows * unroll > budget and rows > 1:
            rows //= 2
    return rows, unroll


def gemv_rows_split(cfg: dict, k_dim: int, int8: bool) -> tuple[int, int]:
    """(splits, k_split): the grid's split of K in whole warp steps, from the weight's shape and
    the configuration only."""
    step_k = 32 * rows_lane_k(int8)
    splits = max(1, min(int(cfg.get("split_k", 1)), cdiv(k_dim, step_k)))
    k_split = cdiv(cdiv(k_dim, splits), step_k) * step_k
    return cdiv(k_dim, k_split), k_split
