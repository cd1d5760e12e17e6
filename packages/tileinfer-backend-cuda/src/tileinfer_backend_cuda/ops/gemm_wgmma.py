"""gemm_wgmma.cu: gemm_invariant.cu's sums on Hopper's wgmma, for the launches whose order it
keeps: bf16 weights summed in contiguous parts (INVARIANT_ORDER's "blocked", or one part) of
products of neighbouring k ("nk"), K a multiple of 64, 4 or 8 token tiles, on sm_90 (wgmma is
Hopper's; the cubin sm_90a's); every epilogue and output of gemm_invariant.cu. A launch setting
of gemm_invariant.cu (``"wgmma": True`` in an INVARIANT_GEMM_TABLE entry or the experiment
switch, from ``"wgmma_min_rows"`` rows if set), which keeps its other settings: ``row_warps``
gives the warpgroups (4 warps each, 64 weight rows of each matrix), ``stages`` the ring's stages
of 64 k, ``split`` the split by run, ``token_groups`` (1, 2 or 4: ``token_groups()``) a block's
groups of 8 token_tiles tokens in launches of more rows than one group holds, ``mma_lag`` a
stage's products left in flight through the next stage's barrier (3 stages or more);
``"tma": True`` brings the weight tiles in by TMA (ops/tensor_map.py) instead of cp.async;
``"producer_warp": True`` (with ``"tma"``, unsplit) runs gemm_wgmma_ws.cu, the same sums with
one thread issuing every copy (weights and tokens by TMA) beside warpgroups that only
multiply. ops/gemm_fp8.py launches the same kernel's FP8 build (W_FP8) for batched FP8
products, through ``launch`` with the scales."""

from __future__ import annotations

from .. import compiler
from . import tensor_map
from .common import cdiv, fit_stages, kernel

STAGE_K = 64  # K a stage; K must be a multiple of it
SWIZZLE_ALIGN = 1024  # the ring's alignment (gemm_wgmma_layout.cuh's WGMMA_ALIGN)


def hopper(device: int) -> bool:
    return compiler.device_arch(device) == "sm_90"  # wgmma is Hopper's alone


def takes(cfg: dict, base: dict, parts: int, k_dim: int, n: int, token_tiles: int,
          device: int) -> bool:
    """Whether a gemm_invariant.cu launch of n rows, settings cfg and gemv.cu build base (its
    order: K in `parts` parts) runs here: the switch is on (from cfg's "wgmma_min_rows" rows) and
    the kernel keeps the order."""
    return (bool(cfg.get("wgmma")) and n >= cfg.get("wgmma_min_rows", 0)
            and not base["W_INT8"] and base.get("NK_PRODUCTS") == 1
            and (base.get("BLOCKED_PARTS") == 1 or parts == 1)
            and k_dim % STAGE_K == 0 and token_tiles in (4, 8) and hopper(device))


def warpgroups(cfg: dict) -> int:
    return max(1, cfg["row_warps"] // 4)


def token_groups(cfg: dict, n: int, token_tiles: int, mats: int = 1) -> int:
    """A block's groups of 8 token_tiles tokens in a launch of n rows: the setting's
    "token_groups" (1, 2 or 4), halved while the block would have more than 4 warpgroups (2 with
    SwiGLU's two matrices, or beside a producer warp: the registers a thread may have in a block
    of so many) or half as many groups would hold the n rows."""
    groups = int(cfg.get("token_groups", 1))
    most = 2 if producer_warp(cfg) else 4  # warpgroups a block
    while groups > 1 and (warpgroups(cfg) * groups * mats > 4
                          or warpgroups(cfg) * groups > most
                          or 8 * token_tiles * groups // 2 >= n):
        groups //= 2
    return groups


def producer_warp(cfg: dict) -> bool:
    """Whether a launch runs gemm_wgmma_ws.cu: the setting, with TMA weights, unsplit."""
    return bool(cfg.get("producer_warp") and cfg.get("tma") and not cfg["split"])


def smem_bytes(cfg: dict, token_tiles: int, mats: int = 1) -> int:
    """STAGES x (mats x block rows + tokens) x 128 bytes (64 k of bf16 a row; mats: 2 with
    SwiGLU; tokens: cfg's "token_groups" of 8 token_tiles) from the first 1024-byte boundary
    (SWIZZLE_ALIGN); a split launch keeps the run's float sums there afterwards,
    [mats][tokens][block rows], if they need more; with TMA an 8-byte mbarrier a stage
    follows, with a producer warp two (full and empty)."""
    rows, tokens = 64 * warpgroups(cfg), 8 * token_tiles * cfg.get("token_groups", 1)
    ring = cfg["stages"] * (mats * rows + tokens) * STAGE_K * 2 + SWIZZLE_ALIGN
    data = max(ring, mats * tokens * rows * 4 + SWIZZLE_ALIGN) if cfg["split"] else ring
    barriers = 2 if producer_warp(cfg) else 1 if cfg.get("tma") else 0
    return data + 8 * barriers * cfg["stages"]


def defines(cfg: dict, base: dict, parts: int, runs: int, token_tiles: int) -> dict:
    out = {k: base[k] for k in ("EPILOGUE", "OUT_DTYPE", "ROUND_BF16")}
    out.update(PARTS=parts, RUNS=runs, WG=warpgroups(cfg), STAGES=cfg["stages"], NT=token_tiles,
               TG=cfg.get("token_groups", 1), ARCH_SPECIFIC=None)
    if not producer_warp(cfg):  # gemm_wgmma.cu's own settings
        out.update(SPLIT=int(cfg["split"]), TMA=int(bool(cfg.get("tma"))))
        if cfg.get("mma_lag") and cfg["stages"] >= 3:  # one filling, one in products, one ending
            out["MMA_LAG"] = 1
    if cfg.get("l2_256b"):
        out["STREAM_L2_256B"] = None
    if base.get("PDL"):
        out["PDL"] = 1
    if base.get("W_FP8"):  # ops/gemm_fp8.py's launches
        out["W_FP8"] = 1
    return out


def launch(out, x, weight, xielu_params, cfg: dict, base: dict, parts: int, runs: int,
           token_tiles: int, o_rows: int, device: int, w_scale=None, x_scale=None):
    """One launch of any number of rows (grid as gemm_invariant.cu's, token blocks of cfg's
    "token_groups" groups, which it sets: token_groups(); cfg's stages brought down to what fits);
    o_rows: the output rows of each matrix. With base's W_FP8, x and weight are e4m3 bytes
    viewed as bf16 pairs (ops/gemm_fp8.py) and w_scale, x_scale their float32 scales."""
    n, k_dim = x.shape
    matrices = mats(base)
    cfg["token_groups"] = token_groups(cfg, n, token_tiles, matrices)
    fit_stages(cfg, lambda c: smem_bytes(c, token_tiles, matrices), device)
    ws = producer_warp(cfg)
    k = kernel("gemm_wgmma_ws.cu" if ws else "gemm_wgmma.cu",
               "gemm_wgmma_ws" if ws else "gemm_wgmma", "ppppiiiqffff" + ("m" if ws else "pp"),
               device, defines(cfg, base, parts, runs, token_tiles))
    block_rows = 64 * warpgroups(cfg)  # of each matrix: a warpgroup's 64
    w_map = tensor_map.weight_map(weight, block_rows) if cfg.get("tma") else None
    row_blocks = cdiv(o_rows, block_rows) * (runs if cfg["split"] else 1)
    groups = cfg.get("token_groups", 1)
    tokens = 8 * token_tiles * groups  # a block's
    threads = 128 * warpgroups(cfg) * groups + (32 if ws else 0)
    args = (out, x, weight, w_map, n, k_dim, o_rows, x.stride(0), *xielu_params)
    if ws:  # the producer's warp last; the tokens' map by value
        args += (tensor_map.token_map(x, tokens),)
    else:
        args += (w_scale, x_scale)
    k.launch((cdiv(n, tokens), row_blocks), (threads,), args,
             smem_bytes(cfg, token_tiles, matrices), pdl=bool(base.get("PDL")))


def mats(base: dict) -> int:
    return 2 if base["EPILOGUE"] == 1 else 1  # SwiGLU: gate and up
