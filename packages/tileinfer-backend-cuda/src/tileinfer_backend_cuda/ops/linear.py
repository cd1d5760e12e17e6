"""The linear ops: decode GEMVs for up to GEMV_MAX_TOKENS token rows, and gemv.cu with several
token tiles up to tuning.WIDE_MAX_TOKENS rows (INT8 64, bf16 16), with the SwiGLU / xIELU
epilogues fused; more rows through cuBLAS (bf16 weights; bf16 or float32 outputs) or gemm.cu
(INT8 weights; from int8_cublas.MIN_ROWS rows, cuBLAS on a bf16 copy: int8_cublas.py).

Which GEMV: one token, and a single sequence's steps (``batch_invariant``, the contract's flag),
take one kernel and configuration per weight at every token count, so that a speculative verify
row equals the 1-token step's bit for bit: gemv_rows.cu for large weights (the fastest stream at
one token) and gemv.cu for small ones (tuning.single_sequence_family), where its tensor cores
make the extra rows of a verify step almost free. Batched steps of 2..8 rows take gemv.cu, which
reads each weight once for all 8 token slots (benchmarks/RESULTS.md, 2026-12-01, "the batched
engine, pipelined"), as do INT8 weights with K % 16 != 0.

Rounding (the linear contract): a bf16 weight's sum is rounded to bf16 (ROUND_BF16) except when
the output is float32 (the logits), which gets the float32 sum itself; an INT8 weight's scaled
sum is rounded once, to the output's dtype.

Shapes: x (n, K) bf16 with unit stride along K; weight (O, K) bf16, or int8 with a float32 scale
per row; out (n, O) bf16 or float32 (SwiGLU: weight (2 * O, K), gate rows over up rows). No
configuration (tuning.py) depends on n: a row's sum is the same at 1 and 8 tokens.

Batched steps of 24..64 rows of the weights in gemm_invariant.BATCHED_GEMM_TABLE (INT8 ones)
take gemm_invariant.cu instead. Batch-invariant steps (``Invariance.BATCH``) of any number of
rows take gemv.cu (invariant_gemv) in an order fixed per weight (determinism.md), or, for
launches of many rows, gemm_invariant.cu: the same sums in the same order.
"""

from __future__ import annotations

import torch

from tileinfer.backend.hookspecs import Invariance

from .common import (DTYPE_NAMES, GEMV_MAX_TOKENS, GEMV_SCRATCH, ONE_BYTE_WEIGHTS, GemvScratch,
                     aligned, cdiv, contig, dev, fallback, fallback_counts, kernel, one_byte,
                     smem_limit, weight_defines)
from . import elementwise, gemm_invariant, int8_cublas
from .cublas import MM_FLOAT32_OUT, cublas
from .invariant_tuning import FP8_GEMV_TABLE, INVARIANT_GEMV_TABLE, invariant_order
from .tuning import (experiments, gemv_config, gemv_rows_split, gemv_rows_tile,
                     gemv_rows_tokens, mma_token_tiles, pdl, rows_lane_k, wide_max_tokens)

EPILOGUES = {"none": 0, "swiglu": 1, "xielu": 2}
NO_XIELU = (0.0, 0.0, 0.0, 0.0)


def gemv_ok(out, x, weight, weight_scale) -> bool:
    n, k_dim = x.shape
    return (x.dtype == torch.bfloat16 and weight.dtype in (torch.bfloat16, *ONE_BYTE_WEIGHTS)
            and out.dtype in (torch.bfloat16, torch.float32) and x.stride(1) == 1
            and x.stride(0) % 8 == 0 and k_dim % 8 == 0 and contig(weight, out, weight_scale)
            and aligned(x, weight)
            and ((weight.dtype == torch.bfloat16 and weight_scale is None)
                 or (one_byte(weight) and weight_scale is not None
                     and weight_scale.dtype == torch.float32)))


def int8_load(k_dim: int) -> int:
    """gemv.cu's INT8_LOAD: bytes of an INT8 weight chunk (16, or 8 where K % 16 != 0)."""
    return 16 if k_dim % 16 == 0 else 8


def gemv_regs(config: dict, int8: bool, load: int) -> int:
    """gemv.cu's REGS of a configuration: its "regs" (steps a register round; 0 streams through
    the ring), where the weight comes in 16-byte chunks (not INT8 loaded 8 bytes at a time) and
    its products are not of neighbouring k ("nk": ldmatrix reads them from the ring)."""
    return int(config.get("regs", 0)) if not (int8 and load != 16 or config.get("nk")) else 0


def gemv_ring_bytes(config: dict, k_dim: int, int8: bool, epilogue: str,
                    token_tiles: int = 1, fp8: bool = False) -> int:
    """gemv.cu's ring: GROUPS x WARPS x STAGES x PARTS x 32 x 16 bytes, PARTS = 2 weight rows per
    16-row tile (tiles per matrix x matrices) + the x chunks of every token tile (one 16-byte
    chunk of e4m3 with FP8, 16 int8 weights' worth of bf16 with INT8); none with REGS. An FP8
    weight is laid out as INT8's (int8 true, 16-byte loads)."""
    if gemv_regs(config, int8, int8_load(k_dim)):
        return 0
    lane_k = int8_load(k_dim) if int8 else 8
    tiles = config.get("tiles", 1) * (2 if epilogue == "swiglu" else 1)
    parts = 2 * tiles + (1 if fp8 else lane_k // 8) * token_tiles
    return config.get("groups", 1) * config["warps"] * config["stages"] * parts * 32 * 16


def gemv_smem_bytes(config: dict, k_dim: int, int8: bool, epilogue: str,
                    token_tiles: int = 1, fp8: bool = False) -> int:
    """gemv.cu's dynamic shared memory: the ring, or the block's partial sums (float
    [GROUPS][WARPS][tiles][16][8 * token_tiles + 1]) that reuse it, whichever is larger."""
    tiles = config.get("tiles", 1) * (2 if epilogue == "swiglu" else 1)
    warps = config.get("groups", 1) * config["warps"]
    partial = warps * tiles * 16 * (8 * token_tiles + 1) * 4
    return max(partial, gemv_ring_bytes(config, k_dim, int8, epilogue, token_tiles, fp8))


def round_bf16(int8: bool, out_dtype: str) -> int:
    """ROUND_BF16 of a build: round a bf16 weight's sum to bf16 before storing, unless the output
    is float32 (the unrounded sum; the SwiGLU / xIELU epilogues round as transformers anyway)."""
    return int(not int8 and out_dtype != "float")


def gemv_defines(cfg: dict, int8: bool, load: int, epilogue: str, out_dtype: str,
                 pdl_on: bool, token_tiles: int = 1, fp8: bool = False) -> dict:
    """The defines of a gemv.cu build (load: its INT8_LOAD; fp8: e4m3 weight and x)."""
    defines = {"W_INT8": int(int8 and not fp8), "INT8_LOAD": load, "EPILOGUE": EPILOGUES[epilogue],
               "OUT_DTYPE": out_dtype, "ROUND_BF16": round_bf16(int8, out_dtype),
               "WARPS": cfg["warps"], "STAGES": cfg["stages"], "TILES": cfg.get("tiles", 1),
               "NT": token_tiles}
    if fp8:
        defines["W_FP8"] = 1
    if cfg.get("groups", 1) > 1:
        defines["GROUPS"] = cfg["groups"]
    if cfg.get("runs", 1) > 1:
        defines["RUNS"] = cfg["runs"]  # the warps' sums in runs (gemm_invariant.py)
    if cfg.get("nk") and not int8:
        defines["NK_PRODUCTS"] = 1  # products of 16 neighbouring k (gemv_nk.cuh)
    if cfg.get("blocked"):
        defines["BLOCKED_PARTS"] = 1  # each warp's K steps contiguous (gemv_parts.cuh)
    elif cfg.get("chunk", 1) > 1:
        defines["PART_CHUNK"] = cfg["chunk"]  # each warp's K steps in chunks (gemv_parts.cuh)
    regs = gemv_regs(cfg, int8, load)
    if regs:
        defines["REGS"] = regs  # the weight through registers, not the ring
    if cfg.get("l2_256b") and "REGS" not in defines:
        defines["STREAM_L2_256B"] = None  # cp.async with a 256-byte L2 prefetch hint
    if cfg.get("xreuse") and "REGS" not in defines:
        defines["X_REUSE"] = 1  # a step's x chunks read from the ring once for all tiles
    if pdl_on:
        defines["PDL"] = 1
    return defines


def gemv_rows_defines(cfg: dict, int8: bool, epilogue: str, out_dtype: str, tokens: int,
                      pdl_on: bool) -> dict:
    """The defines of a gemv_rows.cu build."""
    rows, unroll = gemv_rows_tile(cfg, tokens, int8, epilogue)
    defines = {"W_INT8": int(int8), "EPILOGUE": EPILOGUES[epilogue], "OUT_DTYPE": out_dtype,
               "ROUND_BF16": round_bf16(int8, out_dtype), "ROWS": rows, "UNROLL": unroll,
               "WARPS": cfg["warps"], "TOKENS": tokens}
    if pdl_on:
        defines["PDL"] = 1
    return defines


def gemv(out, x, weight, weight_scale, epilogue="none", xielu_params=NO_XIELU,
         invariant=True):
    """The GEMV of a gemv_ok call: up to GEMV_MAX_TOKENS rows (gemv_rows.cu, or gemv.cu when
    batched: not invariant), up to wide_max_tokens rows (gemv.cu with 2, 4 or 8 token tiles), or
    a batched step of a BATCHED_GEMM_TABLE weight (gemm_invariant.cu in the entry's layout)."""
    n, k_dim = x.shape
    int8 = one_byte(weight)
    o_rows = weight.shape[0] // 2 if epilogue == "swiglu" else weight.shape[0]
    device = dev(out)
    batched = n > GEMV_MAX_TOKENS or (n > 1 and not invariant)
    token_tiles = mma_token_tiles(n) if batched else 1
    cfg = gemv_config(o_rows, k_dim, int8, epilogue, device, kernel="mma" if batched else None,
                      token_tiles=token_tiles)
    if cfg["kernel"] == "rows":
        if k_dim % rows_lane_k(int8) == 0:  # rows start 16-byte aligned
            return _gemv_rows(out, x, weight, weight_scale, epilogue, xielu_params, cfg, o_rows)
        cfg = gemv_config(o_rows, k_dim, int8, epilogue, device, kernel="mma")
    entry = gemm_invariant.batched_settings(o_rows, k_dim, int8, epilogue, n) if batched else None
    if entry is not None:
        layout = {k: entry[k] for k in ("blocked", "chunk", "nk") if k in entry}  # no order kept
        base = gemv_defines({"warps": cfg["warps"], "stages": 2, **layout}, int8, int8_load(k_dim),
                            epilogue, DTYPE_NAMES[out.dtype], pdl(device),
                            token_tiles) | weight_defines(weight)
        return gemm_invariant.gemm_invariant(
            out, x, weight, weight_scale, xielu_params, base, cfg["warps"],
            gemm_invariant.invariant_runs(o_rows, k_dim, int8, epilogue, cfg["warps"]),
            token_tiles, o_rows, epilogue, settings=entry)
    gemv_mma(out, x, weight, weight_scale, epilogue, xielu_params, cfg, token_tiles)


def gemv_mma(out, x, weight, weight_scale, epilogue, xielu_params, cfg, token_tiles,
              x_scale=None):
    """gemv.cu with configuration cfg and token_tiles token tiles of 8 (n <= 8 x token_tiles);
    x_scale: the FP8 build's (x e4m3, weight e4m3)."""
    n, k_dim = x.shape
    fp8 = x_scale is not None
    int8 = fp8 or one_byte(weight)
    o_rows = weight.shape[0] // 2 if epilogue == "swiglu" else weight.shape[0]
    device = dev(out)
    pdl_on = pdl(device)
    defines = gemv_defines(cfg, int8, int8_load(k_dim), epilogue, DTYPE_NAMES[out.dtype], pdl_on,
                           token_tiles, fp8) | weight_defines(weight)
    k = kernel("gemv.cu", "gemv", "ppppiiiqffffp", device, defines)
    groups = cfg.get("groups", 1)
    k.launch((cdiv(o_rows, 16 * defines["TILES"] * groups),), (groups * cfg["warps"] * 32,),
             (out, x, weight, weight_scale, n, k_dim, o_rows, x.stride(0), *xielu_params,
              x_scale),
             gemv_smem_bytes(cfg, k_dim, int8, epilogue, token_tiles, fp8), pdl=pdl_on)


def invariant_gemv(out, x, weight, weight_scale, epilogue="none", xielu_params=NO_XIELU,
                   x_scale=None):
    """A batch-invariant step (Invariance.BATCH) of any number of rows: launches of at most
    gemm_invariant.BLOCK_ROWS rows on gemv.cu's invariant_gemv_config build, or (steps of many
    rows: gemm_invariant.takes) one launch of gemm_invariant.cu with the same sums. What
    orders a row's sum depends on the weight alone: gemv.cu's warps (each sums its K steps on
    the tensor cores; which steps: gemv_parts.cuh) and its runs (the warps' sums added run by
    run, each run in warp order). x_scale: the FP8 build's (x the quantized rows,
    linear_fp8.py)."""
    n, k_dim = x.shape
    fp8 = x_scale is not None
    int8 = fp8 or one_byte(weight)
    o_rows = weight.shape[0] // 2 if epilogue == "swiglu" else weight.shape[0]
    device = dev(out)
    launch_tiles = token_tiles = mma_token_tiles(min(n, gemm_invariant.BLOCK_ROWS))
    cfg = invariant_gemv_config(o_rows, k_dim, int8, epilogue, device, token_tiles, fp8)
    while cfg is None:  # the weight's warps with this many token tiles need too much memory
        token_tiles //= 2
        cfg = invariant_gemv_config(o_rows, k_dim, int8, epilogue, device, token_tiles, fp8)
    if not fp8 and gemm_invariant.takes(o_rows, k_dim, int8, epilogue, n):
        # its own shared memory: the full width
        base = gemv_defines(cfg, int8, int8_load(k_dim), epilogue, DTYPE_NAMES[out.dtype],
                            pdl(device), launch_tiles) | weight_defines(weight)
        return gemm_invariant.gemm_invariant(out, x, weight, weight_scale, xielu_params, base,
                                             cfg["warps"], cfg.get("runs", 1), launch_tiles,
                                             o_rows, epilogue)
    for start in range(0, n, 8 * token_tiles):
        stop = min(n, start + 8 * token_tiles)
        gemv_mma(out[start:stop], x[start:stop], weight, weight_scale, epilogue, xielu_params,
                 cfg, token_tiles, None if x_scale is None else x_scale[start:stop])


def invariant_gemv_config(o_rows: int, k_dim: int, int8: bool, epilogue: str, device: int,
                          token_tiles: int, fp8: bool = False) -> dict | None:
    """gemv.cu's build for token_tiles tiles of a batch-invariant step: INVARIANT_GEMV_TABLE's
    (else the batched table's or heuristic's) stages, 16-row tiles and row groups, with the
    weight's parts (INVARIANT_ORDER's, else its 8-row build's warps) at every count; row groups,
    stages, then tiles come down until a block has at most 1,024 threads and fits in shared
    memory. None when even that does not fit (fewer token tiles then do: one always fits).
    fp8: FP8_GEMV_TABLE's build, warps included, where it has one."""
    key = (o_rows, k_dim, bool(int8), epilogue)
    parts = None if fp8 or experiments["gemv"] else invariant_order(*key).get("parts")
    warps = parts or gemv_config(o_rows, k_dim, int8, epilogue, device, kernel="mma")["warps"]
    entry = INVARIANT_GEMV_TABLE.get(key + (token_tiles,))
    if fp8 and (o_rows, k_dim, epilogue) in FP8_GEMV_TABLE and not experiments["gemv"]:
        entry = FP8_GEMV_TABLE[o_rows, k_dim, epilogue]
        warps = entry["warps"]
    elif entry is None or experiments["gemv"]:
        entry = gemv_config(o_rows, k_dim, int8, epilogue, device, kernel="mma",
                            token_tiles=token_tiles)
    cfg = dict(entry, warps=warps, kernel="mma")
    if not fp8:
        cfg["runs"] = gemm_invariant.invariant_runs(o_rows, k_dim, int8, epilogue, warps)
        cfg.update(blocked=gemm_invariant.blocked_parts(key), chunk=gemm_invariant.part_chunk(),
                   nk=gemm_invariant.nk_products(key))
    limit = smem_limit(device) - 1024  # room for the static shared memory

    def smem():
        return gemv_smem_bytes(cfg, k_dim, int8, epilogue, token_tiles, fp8)

    while cfg.get("groups", 1) > 1 and (cfg["groups"] * warps > 32 or smem() > limit):
        cfg["groups"] //= 2
    while cfg["stages"] > 2 and smem() > limit:
        cfg["stages"] -= 1
    while cfg.get("tiles", 1) > 1 and smem() > limit:
        cfg["tiles"] //= 2
    if token_tiles > 1 and smem() > limit:
        return None
    return cfg


def _gemv_rows(out, x, weight, weight_scale, epilogue, xielu_params, cfg, o_rows):
    n, k_dim = x.shape
    int8 = one_byte(weight)
    device = dev(out)
    splits, k_split = gemv_rows_split(cfg, k_dim, int8)
    scratch = counters = None
    if splits > 1:
        mats = 2 if epilogue == "swiglu" else 1
        buffers = GEMV_SCRATCH.get(device) if GemvScratch.fits(splits, mats, o_rows) else None
        if buffers is None:  # not a ref fallback: the same kernel without the grid's split
            fallback_counts["gemv: no split-K (scratch too small, or first reserved inside a "
                            "graph capture)"] += 1
            splits, k_split = 1, k_dim
        else:
            scratch, counters = buffers
    pdl_on = pdl(device)
    defines = gemv_rows_defines(cfg, int8, epilogue, DTYPE_NAMES[out.dtype], gemv_rows_tokens(n),
                                pdl_on) | weight_defines(weight)
    k = kernel("gemv_rows.cu", "gemv_rows", "ppppiiiqffff" + "ipp", device, defines)
    k.launch((cdiv(o_rows, defines["ROWS"]), splits), (cfg["warps"] * 32,),
             (out, x, weight, weight_scale, n, k_dim, o_rows, x.stride(0), *xielu_params, k_split,
              scratch, counters), pdl=pdl_on)


def gemm(out, x, weight, weight_scale):
    """gemm.cu: prefill with INT8 weights or a float32 output (gemv_ok's layouts)."""
    m, k_dim = x.shape
    n_cols = weight.shape[0]
    int8 = one_byte(weight)
    out_dtype = DTYPE_NAMES[out.dtype]
    defines = {"W_INT8": int(int8), "OUT_DTYPE": out_dtype,
               "ROUND_BF16": round_bf16(int8, out_dtype), **weight_defines(weight)}
    k = kernel("gemm.cu", "gemm", "ppppiiiq", dev(out), defines)
    k.launch((cdiv(n_cols, 128), cdiv(m, 128)), (256,),
             (out, x, weight, weight_scale, m, n_cols, k_dim, x.stride(0)))


def _linear_into(out, x, weight, weight_scale, invariant=True) -> bool:
    """out = x @ W.T with the kernel that fits; False when none does."""
    if x.dim() != 2 or out.dim() != 2 or tuple(out.shape) != (x.shape[0], weight.shape[0]):
        return False
    if (n := x.shape[0]) == 0:
        return True
    if gemv_ok(out, x, weight, weight_scale):
        if _gemv_takes(n, weight):
            gemv(out, x, weight, weight_scale, invariant=invariant)
        elif weight.dtype == torch.bfloat16 and out.dtype == torch.bfloat16:
            cublas(out, x, weight)  # batched steps past gemv.cu, prefill
        elif weight.dtype == torch.bfloat16 and MM_FLOAT32_OUT:
            # the logits: cuBLAS with float32 outputs, the float32 sums unrounded (else gemm.cu)
            cublas(out, x, weight, out_dtype=torch.float32)
        elif int8_cublas.takes(out, x, weight):  # one-byte weights' prefill
            int8_cublas.int8_cublas(out, x, weight, weight_scale)
        else:
            gemm(out, x, weight, weight_scale)
        return True
    if (weight_scale is None and x.dtype == weight.dtype == out.dtype
            and x.dtype in (torch.float32, torch.float16, torch.bfloat16) and out.is_contiguous()):
        torch.matmul(x, weight.t(), out=out)  # float32 / float16 models: cuBLAS
        return True
    return False


def _gemv_takes(n: int, weight, epilogue: str = "none") -> bool:
    """Whether gemv() runs an n-row step: up to GEMV_MAX_TOKENS rows, up to the weight dtype's
    wide_max_tokens, and a batched step BATCHED_GEMM_TABLE gives gemm_invariant.cu."""
    int8, o_rows = one_byte(weight), weight.shape[0] // (2 if epilogue == "swiglu" else 1)
    return n <= GEMV_MAX_TOKENS or n <= wide_max_tokens(int8) or (
        n <= gemm_invariant.BLOCK_ROWS and
        gemm_invariant.batched_settings(o_rows, weight.shape[1], int8, epilogue, n) is not None)


def _invariant_ok(out, x, weight, weight_scale, epilogue="none") -> bool:
    """Whether invariant_gemv runs this batch-invariant step (float32 or float16 models do not:
    the ref backend's rows do)."""
    return (x.dim() == 2 and out.dim() == 2 and x.shape[0] == out.shape[0]
            and (epilogue != "none" or out.shape[1] == weight.shape[0])
            and (epilogue == "none" or out.dtype == torch.bfloat16)
            and gemv_ok(out, x, weight, weight_scale))


def linear(out, x, weight, weight_scale, batch_invariant=True):
    if batch_invariant == Invariance.BATCH:
        if not _invariant_ok(out, x, weight, weight_scale):
            return fallback("linear", f"batch-invariant {x.dtype} x {weight.dtype} -> {out.dtype}",
                            out, x, weight, weight_scale, batch_invariant)
        return invariant_gemv(out, x, weight, weight_scale)
    if not _linear_into(out, x, weight, weight_scale, batch_invariant):
        fallback("linear", f"{x.dtype} x {weight.dtype} -> {out.dtype} layout",
                 out, x, weight, weight_scale, batch_invariant)


def linear_swiglu(out, x, weight, weight_scale, gate_up, batch_invariant=True):
    n = x.shape[0]
    if n == 0:
        return
    if batch_invariant == Invariance.BATCH:
        if not _invariant_ok(out, x, weight, weight_scale, "swiglu"):
            return fallback("linear_swiglu", "batch-invariant layout", out, x, weight,
                            weight_scale, gate_up, batch_invariant)
        return invariant_gemv(out, x, weight, weight_scale, "swiglu")
    if (x.dim() == 2 and _gemv_takes(n, weight, "swiglu") and out.dtype == torch.bfloat16
            and gemv_ok(out, x, weight, weight_scale)):
        return gemv(out, x, weight, weight_scale, "swiglu", invariant=batch_invariant)
    if (gate_up.dtype == x.dtype and gate_up.is_contiguous()
            and elementwise.silu_mul_ok(out, gate_up)
            and _linear_into(gate_up, x, weight, weight_scale, batch_invariant)):
        return elementwise.silu_mul(out, gate_up)
    fallback("linear_swiglu", "layout", out, x, weight, weight_scale, gate_up, batch_invariant)


def linear_xielu(out, x, weight, weight_scale, xielu, batch_invariant=True):
    n = x.shape[0]
    if n == 0:
        return
    s = xielu
    if batch_invariant == Invariance.BATCH:
        if not _invariant_ok(out, x, weight, weight_scale, "xielu"):
            return fallback("linear_xielu", "batch-invariant layout", out, x, weight,
                            weight_scale, xielu, batch_invariant)
        return invariant_gemv(out, x, weight, weight_scale, "xielu",
                              (s.alpha_p, s.alpha_n, s.beta, s.eps))
    if (x.dim() == 2 and _gemv_takes(n, weight, "xielu") and out.dtype == torch.bfloat16
            and gemv_ok(out, x, weight, weight_scale)):
        return gemv(out, x, weight, weight_scale, "xielu", (s.alpha_p, s.alpha_n, s.beta, s.eps),
                    invariant=batch_invariant)
    if (out.dtype == x.dtype and elementwise.xielu_ok(out, out)
            and _linear_into(out, x, weight, weight_scale, batch_invariant)):
        return elementwise.xielu(out, out, s)
    fallback("linear_xielu", "layout", out, x, weight, weight_scale, xielu, batch_invariant)
