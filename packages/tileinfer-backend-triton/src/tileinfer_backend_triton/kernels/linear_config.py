"""The launch configuration of the linear kernels (linear.py): GEMV / GEMM tile configs, the
per-shape GEMV table, the split-K choice and the split-K scratch. Host code only."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from tileinfer.backend.hookspecs import INVARIANT_MAX_ROWS

from .common import INTERPRET_MODE, DeviceScratch, cdiv

ACT_NONE, ACT_SWIGLU, ACT_XIELU = 0, 1, 2
SKINNY_MAX_M = 64  # up to this many tokens: the GEMV kernel; above: the tiled GEMM
# Up to this many tokens of one sequence every row runs the 1-token GEMV code (row-invariant
# results): the contract's bound for batch_invariant steps.
ROW_INVARIANT_MAX_M = INVARIANT_MAX_ROWS


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int = 0  # 0: chosen from the shape (see split_k_for)
    num_warps: int = 4
    num_stages: int = 3
    unroll: int = 1  # CUDA-core rows: K tiles loaded per iteration (1 or 2)
    dot: bool = False  # 1..8 tokens through the tensor-core path too (rows padded to 16)
    # Float weights: every step of a single sequence, a 1-token step too, runs its rows this
    # many to a row program (1, 2 or 4), each loaded weight tile used for all of them
    # (row_group): a decode step and a verify step's rows then run the same compiled program.
    # 1 (off) in every entry: the idle slots cost a 1-token step more than the grouping saves a
    # verify step (docs/triton-kernels.md).
    rows_per_program: int = 1


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3


# Per-shape GEMV tiles for 1..ROW_INVARIANT_MAX_M tokens over gemv_config's defaults,
# (n_out, k, int8, act) -> GemvConfig, in the form benchmarks/ops.py's sweep prints its winners
# (kept where they beat the default; the timings are in benchmarks/RESULTS.md, 2026-11-30,
# "GEMV tables from the sweeps, the split greedy sampler" and later entries). n_out of a SwiGLU
# entry (act 1) is the intermediate size: a program takes block_n gate rows and their up rows.
_G = GemvConfig
GEMV_TABLE: dict[tuple[int, int, bool, int], GemvConfig] = {
    # llama3-8b, bf16
    (6144, 4096, False, 0): _G(8, 256, unroll=2),  # qkv
    (14336, 4096, False, 1): _G(4, 256, unroll=2),  # gate_up
    (128256, 4096, False, 0): _G(4, 1024, unroll=2),  # lm_head
    # llama3-8b, int8
    (6144, 4096, True, 0): _G(4, 1024, unroll=2),  # qkv
    (4096, 4096, True, 0): _G(4, 1024, unroll=2),  # o
    (14336, 4096, True, 1): _G(4, 1024, unroll=2),  # gate_up
    (4096, 14336, True, 0): _G(4, 1024, unroll=2),  # down
    (128256, 4096, True, 0): _G(4, 1024, unroll=2),  # lm_head
    # SmolLM2-135M, bf16: the lm_head on the tensor-core tiles, rows padded to 16 (dot), in
    # every single-sequence step: faster than the row programs at 1 token and far faster at 8
    # (their 1024-wide K step is mostly masked at K = 576). Its layers stay on the row programs,
    # faster at 1 token (benchmarks/triton_dot_rows.py; benchmarks/RESULTS.md, 2026-12-01,
    # "Triton: SmolLM2's GEMVs, row programs against dot tiles")
    (49152, 576, False, 0): _G(32, 64, num_stages=1, dot=True),
    # and its layers on row programs of 4 rows and 256-wide K tiles, two a step (the default's
    # 1024-wide step is 44% masked at K = 576 and a verify step pays that once per row): as
    # fast at 1 token, faster at 8 (`triton_dot_rows.py --rows-sweep`; benchmarks/RESULTS.md,
    # 2026-12-01, "Triton: SmolLM2's layers on narrower row programs")
    (960, 576, False, 0): _G(4, 256, num_warps=2, unroll=2),  # qkv
    (576, 576, False, 0): _G(4, 256, num_warps=4, unroll=2),  # o
    (1536, 576, False, 1): _G(4, 128, num_warps=2, unroll=2),  # gate_up
    # llama3.2-1b, bf16
    (3072, 2048, False, 0): _G(4, 512, unroll=2),  # qkv
    (2048, 2048, False, 0): _G(4, 1024, unroll=2),  # o
    (2048, 8192, False, 0): _G(4, 1024, unroll=2),  # down
    (128256, 2048, False, 0): _G(8, 1024, unroll=1),  # lm_head
    # llama3.2-1b, int8
    (3072, 2048, True, 0): _G(4, 1024, unroll=2),  # qkv
    (2048, 2048, True, 0): _G(4, 1024, unroll=2),  # o
    (8192, 2048, True, 1): _G(4, 1024, unroll=2),  # gate_up
    (2048, 8192, True, 0): _G(8, 1024, split_k=2, unroll=2),  # down
    (128256, 2048, True, 0): _G(4, 1024, unroll=2),  # lm_head
}


def _default_rows_config(int8: bool, act: int, f32: bool) -> GemvConfig:
    """The row programs' tiles of a weight GEMV_TABLE does not list."""
    if f32:
        return GemvConfig(block_n=16, block_k=128, num_warps=4)
    if act == ACT_SWIGLU:
        if int8:
            return GemvConfig(block_n=4, block_k=512, num_warps=4, unroll=2)
        return GemvConfig(block_n=8, block_k=256, num_warps=4, unroll=2)
    return GemvConfig(block_n=8, block_k=512, num_warps=4, unroll=2)


def gemv_config(rows: bool, n: int, k: int, int8: bool, act: int, f32: bool) -> GemvConfig:
    """Default GEMV tiles (from benchmarks/ops.py's sweep over llama decode shapes).

    rows: the row programs' config (one token, or a single sequence's step of up to
    ROW_INVARIANT_MAX_M tokens, every row running exactly the 1-token code): ~4K weight elements
    per program per K tile (16-byte loads, a float32 accumulator that does not spill on sm_90),
    two tiles in flight; SwiGLU programs hold a gate and an up row block, hence their narrower
    tiles. Otherwise (batched steps of 2..64 rows, any step of 9..64): tensor-core tiles of
    16, 32 or 64 token rows against 64 weight rows (32 for SwiGLU's pairs), block_k 128, 3
    cp.async stages (not swept)."""
    if INTERPRET_MODE:  # large tiles, few programs: the interpreter's cost is per program
        return GemvConfig(block_n=64 if act != ACT_SWIGLU else 32, block_k=64 if k <= 256 else 128,
                          unroll=2 if k >= 512 else 1)
    if rows:
        entry = None if f32 else GEMV_TABLE.get((n, k, int8, act))
        if entry is None:
            entry = _default_rows_config(int8, act, f32)
        return replace(entry, **ROW_OVERRIDES) if ROW_OVERRIDES else entry
    return GemvConfig(block_n=32 if act == ACT_SWIGLU else 64, block_k=128, num_warps=4,
                      num_stages=3)


def row_group(cfg: GemvConfig, m: int, int8: bool) -> int:
    """Token rows per row program in a single sequence's step of m rows (linear_loops.py's
    _row_group_k_loop): cfg.rows_per_program at every m, so that a 1-token step and a verify
    step run one compiled program (a row's float32 sum follows the layout Triton compiles a
    program to: a program of one row and a program of four did not sum a row alike on the GPU,
    benchmarks/RESULTS.md, 2026-12-04). INT8 weights keep one row per program."""
    return 1 if int8 else cfg.rows_per_program


# Overrides of the row programs' configs (e.g. {"rows_per_program": 4}) for benchmarks that
# compare them in whole steps (benchmarks/profile_step.py --triton-gemv); empty when shipped.
ROW_OVERRIDES: dict = {}


@dataclass(frozen=True)
class InvariantConfig:
    """Tiles of batch-invariant steps: block_m token rows (one row program per block_m rows) by
    block_n weight rows, K in block_k steps (in segments, ``invariant_segment``)."""

    block_m: int = 16
    block_n: int = 32
    block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3


def invariant_config(n: int, k: int, act: int, f32_out: bool, f32: bool, int8: bool,
                     m: int) -> InvariantConfig:
    """The tiles of a batch-invariant step of m rows. Every tensor-core tiling sums a row over a
    K range in the same order (K in 16-wide products, in order) and so gives the same bits
    whatever the tile sizes (benchmarks/invariant_linear.py --across at llama3-8b's weights;
    the conformance suite checks a row against itself alone at 1..256 rows). So the tiles may
    follow the row count: 16-row tiles (mma) with wide K steps up to 16 rows, 64-row tiles
    (wgmma on Hopper) above, read the weight once. Chosen from benchmarks/RESULTS.md,
    2026-12-02, "Batch-invariant mode on Triton". Float32 activations (f32: their products are not on 16-wide tensor-core steps), INT8
    weights (whose 16- and 64-row tiles do not give the same float32 bits) and Triton's interpreter
    (NumPy products, summed in an order of their shape) keep one tiling for every row count."""
    block_k = next(b for b in (256, 128, 64) if k % b == 0 or b == 64)
    if f32 or int8 or INTERPRET_MODE:
        return InvariantConfig(16, 32, min(block_k, 128), num_stages=3)
    if m <= 16:
        wide = act != ACT_SWIGLU and (n > k or f32_out)
        return InvariantConfig(16, 64 if wide else 32, block_k, num_stages=4)
    wide = act != ACT_SWIGLU and (n <= k or f32_out)
    return InvariantConfig(64, 64 if wide else 32, min(block_k, 128),
                           num_stages=3 if act == ACT_SWIGLU else 4)


# K segments of a batch-invariant product are multiples of this: of every block_k its tilings use
INVARIANT_SEGMENT_ALIGN = 256


def invariant_segment(n: int, k: int, act: int, f32_out: bool, f32: bool, int8: bool,
                      sms: int) -> int:
    """The K length of a batch-invariant product's segments: each segment is summed from zero in
    K order and the segments' sums are added in order, at every row count (split across
    programs where a step's tiles leave the GPU short of programs, else one program after
    another, ``_dot_k_segments``), so they depend on the weight and the GPU alone. As many
    segments as a 1-row step needs to fill the GPU (split_k_for over the 1-row tiling's
    tiles); k itself when one is enough."""
    one_row = invariant_config(n, k, act, f32_out, f32, int8, 1)
    split = split_k_for(cdiv(n, one_row.block_n), k, INVARIANT_SEGMENT_ALIGN, sms)
    return cdiv(cdiv(k, split), INVARIANT_SEGMENT_ALIGN) * INVARIANT_SEGMENT_ALIGN


def gemm_config(m: int, n: int, k: int, act: int, f32: bool) -> GemmConfig:
    """Prefill tiles (steps of more than SKINNY_MAX_M tokens)."""
    if INTERPRET_MODE:
        return GemmConfig(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=1)
    if f32:
        return GemmConfig(block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=2)
    block_n = 64 if act == ACT_SWIGLU else 128
    return GemmConfig(block_m=128, block_n=block_n, block_k=64, num_warps=8,
                      num_stages=4 if act != ACT_SWIGLU else 3)


def split_k_for(tiles: int, k: int, block_k: int, sms: int) -> int:
    """Split K until there are ~2 programs per SM, each with at least one BLOCK_K of work."""
    split = 1
    while tiles * split < 2 * sms and split < 8 and k >= 2 * split * block_k:
        split *= 2
    return split


# Per-device split-K scratch: float32 partial sums (8 MiB) and per-tile arrival counters (zero
# between launches: the last program of each tile re-arms its counter); never grown: a launch
# that needs more runs without split-K.
SCRATCH = DeviceScratch(lambda device: (
    torch.empty(1 << 21, dtype=torch.float32, device=device),
    torch.zeros(1 << 15, dtype=torch.int32, device=device)))


def reserve_scratch(device: torch.device):
    SCRATCH.get(torch.device(device))


def split_scratch(device: torch.device, partials: int, counters: int):
    """The split-K scratch (partial sums, arrival counters) if it holds ``partials`` float32
    sums and ``counters`` counters, else None (the launch then runs without the split)."""
    part, locks = SCRATCH.get(device)
    return (part, locks) if partials <= part.numel() and counters <= locks.numel() else None
