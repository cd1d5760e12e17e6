"""gemm_invariant.cu: the batched rows of a batch-invariant step (``Invariance.BATCH``), with
gemv.cu's sums to the bit, so that linear.invariant_gemv can hand it any launch of at least
``min_rows`` rows (bf16 and INT8 weights; FP8 stays on gemv.cu). It runs the weights of
``INVARIANT_GEMM_TABLE`` (where a sweep found it faster than gemv.cu), every weight's steps of
more than 64 rows, or every weight under the experiment switch's ``"invariant_gemm"``
(``takes``). A launch with the setting ``"wgmma"`` whose order gemm_wgmma.cu keeps runs there.

The order of a row's sum is fixed per weight by gemv.cu's invariant build: its warps (``parts``,
invariant_tuning.INVARIANT_ORDER's, else the weight's 8-row build's), which K steps each part
takes (``blocked_parts``, ``part_chunk``) and ``invariant_runs`` (runs of parts, added run by
run). Narrow weights take several runs so that a launch can give each run a block of its own
(SPLIT: a row tile's runs in one cluster, sm_90) and still fill the GPU; wide ones take one run
(their row tiles fill it alone).

Launch configuration (``gemm_config``): warps a block and 16-row tiles a warp, ring stages and
steps a stage, split or not; from ``INVARIANT_GEMM_TABLE`` (benchmark winners), else the
heuristic; the experiment switch ``"invariant_gemm"`` (tuning.py) overrides any of them and
``min_rows``. None of them changes a row's bits.
"""

from __future__ import annotations

from . import gemm_wgmma
from .common import cdiv, dev, fit_stages, kernel, num_sms
from .invariant_tuning import INVARIANT_GEMM_LAUNCH_KEYS, ORDER_KEYS, invariant_order
from .tuning import experiments, sm90

# Launches of fewer rows stay on gemv.cu (same bits).
MIN_ROWS = 17
# The parts' K steps (gemv_parts.cuh): interleaved (False) or contiguous (True) in both kernels'
# batch-invariant builds. A GEMM that walks the parts one by one reads a row's interleaved steps
# 512 bytes apart (bf16), so the neighbours its 256-byte L2 prefetches bring in wait for later
# parts; contiguous parts read along the row (a faster GEMM) but slow gemv.cu's 1-row steps
# (benchmarks/RESULTS.md, 2026-12-06): off.
BLOCKED_PARTS = False
# Interleaved parts take the K steps in chunks of this many (gemv_parts.cuh's PART_CHUNK, a power
# of two): 1 deals the steps one at a time; longer chunks are longer reads along a row for the
# GEMM's walk, and a block of gemv.cu still reads PARTS neighbouring chunks of a row at once.
PART_CHUNK = 1
# Weights with at most this many output rows (per matrix, a single matrix) are narrow.
NARROW_ROWS = 8192
# The experiment switch's keys that keep the table's routing: the order's, and which kernel runs
# a launch.
ROUTE_KEEPING = ORDER_KEYS | {"wgmma", "tma", "wgmma_min_rows", "token_groups", "mma_lag",
                              "producer_warp", "wide"}
# The settings that "wide" (those of launches of more than BLOCK_ROWS rows) may replace: how a
# launch runs, never the order of its sums (ORDER_KEYS) or which launches it takes.
WIDE_KEYS = INVARIANT_GEMM_LAUNCH_KEYS
# Token rows of a block of either kernel (gemv.cu's widest build: 8 token tiles of 8).
BLOCK_ROWS = 64
# The most blocks of a cluster that every sm_90 GPU can launch (a split launch: one a run).
MAX_CLUSTER = 8

# (output rows, K, int8, epilogue) -> launch settings ("row_warps", "row_tiles", "stages",
# "stage_steps", "split", "wgmma", "tma", "wgmma_min_rows", "token_groups", "mma_lag"; "wide":
# those that replace them in launches of more than BLOCK_ROWS rows) and "min_rows" (else
# MIN_ROWS): the weights whose batch-invariant launches of that many rows or more run
# gemm_invariant.cu, with the winners of `benchmarks/batched_linear.py --gemm-sweep N` where they
# beat gemv.cu, in the orders of INVARIANT_ORDER: llama3-8b's gate/up and lm_head (measured in
# one part, which gate/up has left for 4 contiguous parts; H100, benchmarks/RESULTS.md,
# 2026-12-06, "K in one part", and (late evening)), qkv from 17 rows and down from 33
# (contiguous parts, products of neighbouring k, a cluster a row tile; gemv.cu was faster for
# down at 32 rows, slower for qkv: benchmarks/RESULTS.md, 2026-12-06 (final), "products of
# neighbouring k"). On Hopper qkv, o, down and gate/up run gemm_wgmma.cu (gate/up from 33 rows:
# at 32 its launch was slower than gemm_invariant.cu's), o from 33 rows (gemv.cu below;
# benchmarks/RESULTS.md, 2026-12-06 (night), "wgmma at 64 rows"; "token_groups" changed no
# prefill there). In gemv.cu's default order (8 interleaved parts) none beat gemv.cu.
# The prefill's launches (more than BLOCK_ROWS rows) of qkv, o and down: unsplit (blocks enough
# without), two token groups a block, products in flight (at 1,024 rows faster than their
# 64-row settings; gate/up's were not: benchmarks/RESULTS.md, 2026-12-06 (evening, second
# session)).
WIDE = {"split": False, "mma_lag": True, "token_groups": 2}
INVARIANT_GEMM_TABLE: dict[tuple[int, int, bool, str], dict] = {
    (14336, 4096, False, "swiglu"): {"row_warps": 8, "row_tiles": 1, "stages": 4,
                                     "stage_steps": 2, "split": False, "wgmma": True,
                                     "tma": True, "wgmma_min_rows": 33},
    (128256, 4096, False, "none"): {"row_warps": 4, "row_tiles": 2, "stages": 3,
                                    "stage_steps": 2, "split": False},
    (6144, 4096, False, "none"): {"row_warps": 8, "row_tiles": 2, "stages": 4,
                                  "stage_steps": 2, "split": True, "wgmma": True, "wide": WIDE},
    (4096, 4096, False, "none"): {"row_warps": 4, "row_tiles": 2, "stages": 4,
                                  "stage_steps": 2, "split": True, "wgmma": True, "tma": True,
                                  "min_rows": 33, "wide": WIDE},
    (4096, 14336, False, "none"): {"row_warps": 4, "row_tiles": 2, "stages": 4,
                                   "stage_steps": 2, "split": True, "wgmma": True, "tma": True,
                                   "min_rows": 33, "wide": WIDE},
}

# Batched steps of fewer rows keep gemv.cu's token tiles (at 17 rows they were faster).
BATCHED_MIN_ROWS = 24
# (output rows, K, int8, epilogue) -> the launch settings and the parts' layout ("blocked",
# "chunk", "nk") of batched steps of BATCHED_MIN_ROWS..64 rows outside the batch-invariant mode,
# where no order is kept and the fastest layout may run: the weights for which
# `benchmarks/batched_linear.py [--int8] --gemm-sweep 64` found gemm_invariant.cu faster than
# the default path there (INT8: gemv.cu's 8 token tiles; bf16: cuBLAS) (its BATCHED_GEMM_TABLE
# entries): llama3-8b's INT8 gate/up and lm_head on an H100 (benchmarks/RESULTS.md, 2026-12-06
# (night)).
BATCHED_GEMM_TABLE: dict[tuple[int, int, bool, str], dict] = {
    (14336, 4096, True, "swiglu"): {"row_warps": 8, "row_tiles": 1, "stages": 3,
                                    "stage_steps": 2, "split": False, "chunk": 4},
    (128256, 4096, True, "none"): {"row_warps": 8, "row_tiles": 2, "stages": 3,
                                   "stage_steps": 2, "split": False, "chunk": 4},
}


def invariant_runs(o_rows: int, k_dim: int, int8: bool, epilogue: str, parts: int) -> int:
    """Runs of gemv.cu's batch-invariant sum for a weight of o_rows output rows summed in
    `parts` parts (its warps), where they divide them: the experiment switch's ``"runs"``, else
    INVARIANT_ORDER's, else 4 (or 2) for a narrow single matrix and 1 for the others."""
    for runs in (experiments["invariant_gemm"].get("runs"),
                 invariant_order(o_rows, k_dim, int8, epilogue).get("runs")):
        if runs and parts % runs == 0:
            return int(runs)
    if epilogue == "swiglu" or o_rows > NARROW_ROWS:
        return 1
    for runs in (4, 2):
        if parts % runs == 0:
            return runs
    return 1


def blocked_parts(key: tuple) -> bool:
    """Whether the parts of this weight's (output rows, K, int8, epilogue) batch-invariant sums
    take contiguous K steps: the experiment switch's, else INVARIANT_ORDER's, else BLOCKED_PARTS."""
    order = invariant_order(*key)
    return bool(experiments["invariant_gemm"].get("blocked", order.get("blocked", BLOCKED_PARTS)))


def nk_products(key: tuple) -> bool:
    """Whether this bf16 weight's batch-invariant sums take products of 16 neighbouring k
    (gemv_nk.cuh): the experiment switch's "nk", else INVARIANT_ORDER's; never INT8 or FP8."""
    order = invariant_order(*key)
    return not key[2] and bool(experiments["invariant_gemm"].get("nk", order.get("nk", False)))


def part_chunk() -> int:
    return int(experiments["invariant_gemm"].get("chunk", PART_CHUNK))


def min_rows() -> int:
    return int(experiments["invariant_gemm"].get("min_rows", MIN_ROWS))


def fits(o_rows: int, k_dim: int, int8: bool, epilogue: str) -> bool:
    """Whether the weight is under 4 GB: the kernel addresses its rows by 32-bit offsets."""
    mats = 2 if epilogue == "swiglu" else 1
    return mats * o_rows * k_dim * (1 if int8 else 2) < 2**32


def takes(o_rows: int, k_dim: int, int8: bool, epilogue: str, rows: int) -> bool:
    """Whether gemm_invariant.cu runs a batch-invariant step of `rows` rows of this weight (else
    gemv.cu, the same bits, a launch a block of rows): every weight past a block of BLOCK_ROWS
    (prefill: one launch reads the weight once for all its rows); under the experiment switch's
    launch settings (or min_rows) every weight from its ``min_rows``, else the table's from
    their entry's (else MIN_ROWS), an experiment of the order or the kernel alone
    (ROUTE_KEEPING) keeping the table's; none over 4 GB (``fits``)."""
    if not fits(o_rows, k_dim, int8, epilogue):
        return False
    if rows > BLOCK_ROWS:
        return True
    if set(experiments["invariant_gemm"]) - ROUTE_KEEPING:
        return rows >= min_rows()
    entry = INVARIANT_GEMM_TABLE.get((o_rows, k_dim, bool(int8), epilogue))
    return entry is not None and rows >= entry.get("min_rows", MIN_ROWS)


def batched_settings(o_rows: int, k_dim: int, int8: bool, epilogue: str, rows: int) -> dict | None:
    """The BATCHED_GEMM_TABLE entry with which gemm_invariant.cu runs a batched step (outside
    the batch-invariant mode) of `rows` rows of this weight, or None (gemv.cu's token tiles)."""
    if rows < BATCHED_MIN_ROWS or not fits(o_rows, k_dim, int8, epilogue):
        return None
    return BATCHED_GEMM_TABLE.get((o_rows, k_dim, bool(int8), epilogue))


def lane_k(int8: bool, load: int) -> int:
    return load if int8 else 8


def block_rows(cfg: dict) -> int:
    """Output rows of a block: ROW_WARPS warps of ROW_TILES 16-row tiles."""
    return 16 * cfg["row_warps"] * cfg.get("row_tiles", 1)


def gemm_smem_bytes(cfg: dict, int8: bool, load: int, epilogue: str, token_tiles: int) -> int:
    """STAGES x STAGE_STEPS slots of (ROW_WARPS x 2 x MATS x ROW_TILES weight cells + NT x XVECS
    x cells) x 32 lanes x 16 bytes; a split launch keeps the run's float sums there afterwards,
    [MATS][8 NT tokens][block rows], if they need more."""
    mats = 2 if epilogue == "swiglu" else 1
    xvecs = lane_k(int8, load) // 8
    slots = cfg["stages"] * cfg.get("stage_steps", 1)
    w_cells = cfg["row_warps"] * 2 * mats * cfg.get("row_tiles", 1)
    ring = slots * (w_cells + token_tiles * xvecs) * 32 * 16
    if cfg.get("split"):
        return max(ring, mats * 8 * token_tiles * block_rows(cfg) * 4)
    return ring


def gemm_config(o_rows: int, k_dim: int, int8: bool, epilogue: str, runs: int, n: int,
                load: int, token_tiles: int, device: int, settings: dict | None = None) -> dict:
    """Row warps, row tiles, stages, steps a stage, split and the L2 hint of a launch of n rows:
    the table's or the heuristic's (4 warps of one tile, 4 stages of one step; a block per run
    where the row tiles alone leave the GPU half empty), then the experiments'; or, for a
    batched step (``settings``: a BATCHED_GEMM_TABLE entry), the heuristic's and the entry's.
    A split needs sm_90's clusters and at most MAX_CLUSTER runs. SwiGLU keeps one tile a warp;
    stages come down until the block fits."""
    cfg = {"row_warps": 4, "stages": 4, "l2_256b": True}
    if settings is None:
        cfg.update(INVARIANT_GEMM_TABLE.get((o_rows, k_dim, bool(int8), epilogue), {}))
        cfg.update(experiments["invariant_gemm"])
        for key in ORDER_KEYS | {"min_rows"}:  # not launch settings
            cfg.pop(key, None)
        wide = cfg.pop("wide", {})
        if n > BLOCK_ROWS:
            cfg.update(wide_settings(wide))
    else:
        cfg.update({k: v for k, v in settings.items() if k not in ORDER_KEYS})
    if epilogue == "swiglu":
        cfg["row_tiles"] = 1  # two matrices' tiles already; four would spill the sums' registers
    tiles = cdiv(o_rows, block_rows(cfg))
    if "split" not in cfg:
        cfg["split"] = tiles < 2 * num_sms(device)
    cfg["split"] = bool(cfg["split"]) and 1 < runs <= MAX_CLUSTER and sm90(device)
    return fit_stages(cfg, lambda c: gemm_smem_bytes(c, int8, load, epilogue, token_tiles),
                      device)


def wide_settings(wide: dict) -> dict:
    """A "wide" entry's settings, checked: launch settings alone (WIDE_KEYS), so that a launch of
    many rows keeps the order of a launch of few."""
    unknown = set(wide) - WIDE_KEYS
    if unknown:
        raise ValueError(f"invariant_gemm 'wide': not launch settings: {sorted(unknown)}")
    return wide


def gemm_defines(cfg: dict, base: dict, parts: int, runs: int, token_tiles: int,
                 k_dim: int = 0) -> dict:
    """gemm_invariant.cu's defines: gemv.cu's W_INT8, W_E4M3, INT8_LOAD, EPILOGUE, OUT_DTYPE,
    ROUND_BF16 and PDL (base), the sums' order, the launch's build; K_ALIGNED where k_dim is a
    multiple of a K step (no chunk of any step past K)."""
    defines = {k: base[k] for k in ("W_INT8", "INT8_LOAD", "EPILOGUE", "OUT_DTYPE", "ROUND_BF16")}
    # how the weight's bytes read, and which k go where
    for order in ("W_E4M3", "BLOCKED_PARTS", "PART_CHUNK", "NK_PRODUCTS"):
        if order in base:
            defines[order] = base[order]
    defines.update(PARTS=parts, RUNS=runs, ROW_WARPS=cfg["row_warps"],
                   ROW_TILES=cfg.get("row_tiles", 1), STAGES=cfg["stages"],
                   STAGE_STEPS=cfg.get("stage_steps", 1), NT=token_tiles,
                   SPLIT=int(cfg["split"]))
    if cfg.get("l2_256b"):
        defines["STREAM_L2_256B"] = None
    if base.get("PDL"):
        defines["PDL"] = 1
    if k_dim and k_dim % (4 * lane_k(bool(base["W_INT8"]), base["INT8_LOAD"])) == 0:
        defines["K_ALIGNED"] = 1
    return defines


def gemm_invariant(out, x, weight, weight_scale, xielu_params, base: dict, parts: int,
                   runs: int, token_tiles: int, o_rows: int, epilogue: str,
                   settings: dict | None = None):
    """One launch of any number of rows, in blocks of 8 x token_tiles; base: the gemv.cu
    build's defines (its order); settings: a batched step's BATCHED_GEMM_TABLE entry
    (gemm_config)."""
    n, k_dim = x.shape
    device = dev(out)
    int8 = bool(base["W_INT8"])
    load = base["INT8_LOAD"]
    cfg = gemm_config(o_rows, k_dim, int8, epilogue, runs, n, load, token_tiles, device,
                      settings)
    if gemm_wgmma.takes(cfg, base, parts, k_dim, n, token_tiles, device):
        return gemm_wgmma.launch(out, x, weight, xielu_params, cfg, base, parts, runs,
                                 token_tiles, o_rows, device)
    defines = gemm_defines(cfg, base, parts, runs, token_tiles, k_dim)
    k = kernel("gemm_invariant.cu", "gemm_invariant", "ppppiiiqffff", device, defines)
    row_blocks = cdiv(o_rows, block_rows(cfg)) * (runs if cfg["split"] else 1)  # y: tile, run
    k.launch((cdiv(n, 8 * token_tiles), row_blocks),
             (cfg["row_warps"] * 32,),
             (out, x, weight, weight_scale, n, k_dim, o_rows, x.stride(0), *xielu_params),
             gemm_smem_bytes(cfg, int8, load, epilogue, token_tiles), pdl=bool(base.get("PDL")))
