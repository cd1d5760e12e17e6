"""gemm_fp8_stream.cu's launches: gemm_fp8.py's batched FP8 products of up to 64 rows (one
token block) as one even stream of K stages per block, a grid of as many blocks as the SMs
hold at once (stream-K; the kernel's header says how the row tiles' sums are joined). Taken
where gemm_fp8.py's settings say ``"stream": True`` (FP8_GEMM_TABLE, or the experiment switch's
"fp8_gemm"), with these keys of them: ``row_warps`` (4 or 8: one or two warpgroups, 64 weight
rows each), ``stream_stages`` (the ring's stages, brought down to what fits), ``stream_boxes``
(1, 2 or 4 boxes of 128 e4m3 k a stage) and ``stream_ctas`` (blocks a SM, 1 or 2)."""

from __future__ import annotations

from . import tensor_map
from .common import STREAM_SCRATCH, StreamScratch, cdiv, fit_stages, kernel, num_sms
from .gemm_wgmma import STAGE_K, SWIZZLE_ALIGN, warpgroups

MAX_TOKENS = 64  # one token block: 8 token tiles of 8
BOX_K = 2 * STAGE_K  # e4m3 k of a box: 128 bytes of each weight row and each token, one part
DEFAULTS = {"stream_stages": 8, "stream_ctas": 1, "stream_boxes": 1}


def setting(cfg: dict, key: str) -> int:
    return int(cfg.get(key, DEFAULTS[key]))


def takes(cfg: dict, n: int, k_dim: int) -> bool:
    """Whether gemm_fp8.py's launch of n rows and settings cfg runs here: asked for, one token
    block, K (e4m3) a multiple of a stage."""
    return (bool(cfg.get("stream")) and n <= MAX_TOKENS
            and k_dim % (BOX_K * setting(cfg, "stream_boxes")) == 0)


def smem_bytes(stages: int, boxes: int, wg: int, mats: int, token_tiles: int) -> int:
    """STAGES x boxes x (mats x 64 wg weight rows + 8 token_tiles tokens) x 128 bytes from the
    first 1024-byte boundary, then an 8-byte mbarrier a stage."""
    rows = mats * 64 * wg + 8 * token_tiles
    return stages * boxes * rows * BOX_K + SWIZZLE_ALIGN + 8 * stages


def stages_that_fit(cfg: dict, wg: int, mats: int, token_tiles: int, device: int) -> int:
    """cfg's stages (at least 3), fewer where the blocks a SM would not fit its shared memory."""
    boxes = setting(cfg, "stream_boxes")
    ring = fit_stages({"stages": setting(cfg, "stream_stages")},
                      lambda c: smem_bytes(c["stages"], boxes, wg, mats, token_tiles), device,
                      blocks_per_sm=setting(cfg, "stream_ctas"), least=3)
    return ring["stages"]


def grid_blocks(cfg: dict, o_rows: int, k_dim: int, wg: int, device: int) -> int:
    """The grid: stream_ctas blocks a SM, at most one a stage of the work."""
    stages = cdiv(o_rows, 64 * wg) * (k_dim // (BOX_K * setting(cfg, "stream_boxes")))
    return min(num_sms(device) * setting(cfg, "stream_ctas"), stages)


def launch(out, xq_pairs, x_scale, weight_pairs, w_scale, base: dict, xielu_params, cfg: dict,
           token_tiles: int, o_rows: int, device: int) -> bool:
    """One launch (gemm_fp8.launch's arguments: the e4m3 tokens and weight as bf16 pairs, base
    its defines); False, launching nothing, where the scratch lacks room for the grid or is
    missing (first needed inside a graph capture)."""
    n, k_units = xq_pairs.shape
    wg, mats = warpgroups(cfg), 2 if base["EPILOGUE"] == 1 else 1
    blocks = grid_blocks(cfg, o_rows, 2 * k_units, wg, device)
    threads = 128 * wg
    scratch = STREAM_SCRATCH.get(device)
    if scratch is None or not StreamScratch.fits(blocks, threads * mats * token_tiles * 4):
        return False
    partials, flags = scratch
    stages = stages_that_fit(cfg, wg, mats, token_tiles, device)
    boxes = setting(cfg, "stream_boxes")
    defines = {k: base[k] for k in ("EPILOGUE", "OUT_DTYPE", "ROUND_BF16", "PDL")}
    defines.update(WG=wg, STAGES=stages, BOXES=boxes, NT=token_tiles, ARCH_SPECIFIC=None)
    k = kernel("gemm_fp8_stream.cu", "gemm_fp8_stream", "pppiiiqffffpppp", device, defines)
    w_map = tensor_map.weight_map(weight_pairs, 64 * wg)
    args = (out, xq_pairs, w_map, n, k_units, o_rows, xq_pairs.stride(0), *xielu_params, w_scale,
            x_scale, partials, flags)
    k.launch((blocks,), (threads,), args, smem_bytes(stages, boxes, wg, mats, token_tiles),
             pdl=bool(base["PDL"]))
    return True
