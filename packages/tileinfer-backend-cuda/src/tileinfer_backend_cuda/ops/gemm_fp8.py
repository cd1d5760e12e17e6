"""Batched FP8 products on Hopper's FP8 tensor cores: gemm_wgmma.cu built with W_FP8, for the
steps of linear_fp8.py with more rows than gemv.cu takes (batched decode, short prefill chunks)
outside the batch-invariant mode, in place of ``torch._scaled_mm``.

Why a kernel of our own: cuBLASLt's FP8 GEMM tiles 128 token rows, so a step of 64 rows leaves
half of each tile empty and few blocks for the small matrices (llama3-8b's qkv: 48 tiles of 128
outputs for 132 SMs); its batch-64 products read the weights at about half the bandwidth
(benchmarks/RESULTS.md, 2026-12-03, "FP8 weights on cuda"). Here a block holds 64 weight rows of
each matrix (a warpgroup's) for 8 x token_tiles tokens, narrow weights split K into runs (one
block a run, a row tile's runs in one cluster), and the MLP's SwiGLU / xIELU run in the epilogue.

The kernel walks e4m3 rows as pairs of bytes (its header), so the tokens (fp8_quant.cu's bytes)
and the weight go in as bf16 views of half the width. A row's sum runs in parts of PART_K k,
each part's products from zero in the tensor cores and the parts added in float32 (the header's
reason). The settings per weight: ``FP8_GEMM_TABLE``, else ``gemm_settings``' rule; the
experiment switch's ``"fp8_gemm"`` (tuning.py) overrides any of them, ``"max_tokens"`` (the most
rows it takes) and ``"enabled"`` (whether it takes any step: ENABLED's default). With
``"stream"`` a launch of up to 64 rows runs gemm_fp8_stream.cu instead (ops/gemm_fp8_stream.py:
the same products as one even stream of K stages a block; off by default, no faster where
measured: benchmarks/RESULTS.md, 2026-12-08).
"""

from __future__ import annotations

import torch

from . import gemm_fp8_stream, gemm_wgmma
from .common import cdiv, num_sms
from .gemm_invariant import MAX_CLUSTER
from .linear import EPILOGUES
from .tuning import experiments, pdl

# On: faster than torch._scaled_mm at 32 and 64 rows of llama3-8b, and as near ref's sums
# (benchmarks/RESULTS.md, 2026-12-07 (night)); the switch's "enabled" turns it off to compare.
ENABLED = True
PART_K = 128  # e4m3 k a part (the switch's "part_k": 64, 128 or 256): one ring stage
# e4m3 k a ring stage (the kernel counts 2-byte units): K must be a multiple of it
STAGE_K = 2 * gemm_wgmma.STAGE_K
# The most rows of a step it takes: those measured faster than torch._scaled_mm (32 and 64
# rows). Larger steps (bigger batches, prefill chunks) stay on torch._scaled_mm, whose 128-row
# tiles they fill; the switch's "max_tokens" runs them here (the kernel takes any row count).
MAX_TOKENS = 64

# (output rows, K, epilogue) -> settings where gemm_settings' rule is not the best measured: the
# winners of `benchmarks/fp8_gemm_sweep.py --rows 64 --stages 4` (llama3-8b, H100,
# benchmarks/RESULTS.md, 2026-12-07 (night), "Batched FP8 products on gemm_wgmma.cu").
FP8_GEMM_TABLE: dict[tuple[int, int, str], dict] = {
    (6144, 4096, 'none'): {'row_warps': 8, 'stages': 4, 'runs': 4, 'mma_lag': True},
    (4096, 4096, 'none'): {'row_warps': 4, 'stages': 4, 'runs': 4, 'mma_lag': True},
    (14336, 4096, 'swiglu'): {'row_warps': 4, 'stages': 4, 'runs': 1, 'mma_lag': False},
    (4096, 14336, 'none'): {'row_warps': 4, 'stages': 4, 'runs': 4, 'mma_lag': False},
}


def takes(n: int, k_dim: int, device: int) -> bool:
    """Whether a step of n rows (more than gemv.cu takes) runs here: Hopper, K a multiple of a
    stage and of a part, at most MAX_TOKENS rows, enabled (ENABLED, or the switch's "enabled")."""
    asked = experiments["fp8_gemm"]
    return (asked.get("enabled", ENABLED) and n <= asked.get("max_tokens", MAX_TOKENS)
            and k_dim % max(STAGE_K, part_k()) == 0 and gemm_wgmma.hopper(device))


def part_k() -> int:
    return int(experiments["fp8_gemm"].get("part_k", PART_K))


def token_tiles(n: int) -> int:
    return 4 if n <= 32 else 8  # wgmma's n32 or n64 a token group


def gemm_settings(o_rows: int, k_dim: int, epilogue: str, n: int, device: int) -> dict:
    """A launch's settings: the table's, else one warpgroup a block (64 rows of each matrix),
    four stages by TMA with a stage's products in flight, two token groups where the rows fill
    them, and K split into the fewest runs (a power of two, at most a cluster's MAX_CLUSTER,
    whole parts each) that give every SM a block; then the switch's."""
    cfg = {"row_warps": 4, "stages": 4, "tma": True, "mma_lag": True, "token_groups": 2,
           "l2_256b": True}
    blocks = cdiv(o_rows, 64) * cdiv(n, 8 * token_tiles(n))
    runs, parts = 1, k_dim // part_k()
    while blocks * runs < num_sms(device) and runs < MAX_CLUSTER and parts % (2 * runs) == 0:
        runs *= 2
    cfg["runs"] = runs
    cfg.update(FP8_GEMM_TABLE.get((o_rows, k_dim, epilogue), {}))
    which = ("max_tokens", "enabled", "part_k")  # the switch's keys that are not a launch's
    cfg.update({k: v for k, v in experiments["fp8_gemm"].items() if k not in which})
    cfg["split"] = cfg["runs"] > 1
    return cfg


def launch(out, xq, x_scale, weight, w_scale, epilogue: str, xielu_params, device: int):
    """out (n, O) = epilogue(the FP8 product): xq (n, K) e4m3 bytes with x_scale (n,), weight
    (mats O, K) e4m3 with w_scale (mats O,) float32 (SwiGLU: gate rows, then up rows)."""
    n, k_dim = xq.shape
    base = {"EPILOGUE": EPILOGUES[epilogue], "OUT_DTYPE": "bf16_t", "ROUND_BF16": 1,
            "PDL": int(pdl(device)), "W_FP8": 1}
    mats = gemm_wgmma.mats(base)
    o_rows = weight.shape[0] // mats
    cfg = gemm_settings(o_rows, k_dim, epilogue, n, device)
    tiles = token_tiles(n)
    pairs = lambda t: t.view(torch.uint8).view(torch.bfloat16)  # noqa: E731  (n, K / 2)
    if part_k() == STAGE_K and gemm_fp8_stream.takes(cfg, n, k_dim) and gemm_fp8_stream.launch(
            out, pairs(xq), x_scale, pairs(weight), w_scale, base, xielu_params, cfg, tiles,
            o_rows, device):
        return
    gemm_wgmma.launch(out, pairs(xq), pairs(weight), xielu_params, cfg, base,
                      k_dim // part_k(), cfg["runs"], tiles, o_rows, device, w_scale, x_scale)
