"""Representative builds of every kernel file of the CUDA backend: each define of each file takes
each of its values at least once, and the builds the ops launch by default are among them.
test_cuda_compile.py compiles all of them to cubins (no GPU needed); tools/gpu_check.sh compiles
them into the disk cache before the GPU tests.

A build is ``(file, defines, extra_options)`` as ``compiler.compile_cubin`` takes them.
"""

from __future__ import annotations

from tileinfer_backend_cuda.ops.attention import DECODE_OPTIONS
from tileinfer_backend_cuda.ops.sampling import SAMPLING_OPTIONS


def builds() -> list[tuple[str, dict, tuple]]:
    out: list[tuple[str, dict, tuple]] = []
    add = lambda file, extra=(), **defines: out.append((file, defines, extra))  # noqa: E731

    for dtype, vec in (("bf16_t", 8), ("f16_t", 8), ("float", 4), ("bf16_t", 1)):
        add("elementwise.cu", DTYPE=dtype, VEC=vec)
        add("norm.cu", DTYPE=dtype, VEC=vec)
    add("elementwise.cu", VEC16=None)
    add("norm.cu", DTYPE="bf16_t", WEIGHT_DTYPE="float", VEC=4)
    add("norm.cu", DTYPE="bf16_t", WEIGHT_DTYPE="float", VEC=4, GEMMA=1)  # Gemma's norms
    add("norm.cu", DTYPE="bf16_t", VEC=8, E4M3_OUT=1)  # add_rmsnorm_e4m3

    for head_dim in (64, 96, 128, 256):
        add("kv.cu", DTYPE="bf16_t", HEAD_DIM=head_dim, CACHE_INT8=0, CACHE_DTYPE="bf16_t")
        add("kv.cu", DTYPE="bf16_t", HEAD_DIM=head_dim, CACHE_INT8=1)
    add("kv.cu", DTYPE="float", HEAD_DIM=128, CACHE_INT8=0, CACHE_DTYPE="float", QOUT_DTYPE="float",
        NORM_DTYPE="float")
    add("kv.cu", DTYPE="f16_t", HEAD_DIM=64, CACHE_INT8=1, NORM_DTYPE="float")

    for w_int8, int8_load in ((0, 16), (1, 16), (1, 8)):
        for epilogue in (0, 1, 2):
            for out_dtype in ("bf16_t", "float"):
                add("gemv.cu", W_INT8=w_int8, INT8_LOAD=int8_load, EPILOGUE=epilogue,
                    OUT_DTYPE=out_dtype, ROUND_BF16=1 - w_int8, WARPS=8, STAGES=8)
    for warps, stages in ((4, 2), (4, 3), (16, 4), (16, 8)):
        add("gemv.cu", WARPS=warps, STAGES=stages)
    add("gemv.cu", STREAM_L2_256B=None)
    for w_int8, epilogue in ((0, 0), (1, 1)):  # programmatic dependent launch
        add("gemv.cu", W_INT8=w_int8, EPILOGUE=epilogue, ROUND_BF16=1 - w_int8, WARPS=8, STAGES=8, PDL=1)
    add("gemv.cu", WARPS=4, STAGES=2, PDL=1)
    add("gemv.cu", WARPS=2, STAGES=3)
    # the register stream: each epilogue and weight dtype, token tiles, tiles, PDL
    for w_int8, epilogue, regs, nt, tiles in ((0, 0, 4, 1, 1), (0, 1, 2, 2, 1), (1, 2, 3, 8, 2),
                                              (1, 1, 2, 1, 2)):
        add("gemv.cu", W_INT8=w_int8, EPILOGUE=epilogue, ROUND_BF16=1 - w_int8, WARPS=8,
            STAGES=2, REGS=regs, NT=nt, TILES=tiles, PDL=1)
    add("gemv.cu", REGS=1, WARPS=16, OUT_DTYPE="float", ROUND_BF16=0)
    # row groups and x reuse (batch-invariant steps of 9..64 rows): the ring, the register stream
    add("gemv.cu", WARPS=8, STAGES=3, TILES=2, NT=8, GROUPS=2, PDL=1)
    add("gemv.cu", WARPS=8, STAGES=2, TILES=4, NT=8, X_REUSE=1, PDL=1)
    add("gemv.cu", W_INT8=1, EPILOGUE=1, ROUND_BF16=0, WARPS=4, STAGES=2, TILES=2, NT=8, X_REUSE=1)
    add("gemv.cu", W_INT8=1, EPILOGUE=1, ROUND_BF16=0, WARPS=4, STAGES=2, NT=4, GROUPS=4)
    add("gemv.cu", WARPS=8, STAGES=2, REGS=2, NT=8, GROUPS=4, OUT_DTYPE="float", ROUND_BF16=0)
    add("gemv.cu", WARPS=8, STAGES=3, TILES=2, NT=8, RUNS=4, PDL=1)  # runs of warps
    add("gemv.cu", W_INT8=1, ROUND_BF16=0, WARPS=16, STAGES=2, REGS=2, RUNS=2, BLOCKED_PARTS=1)
    add("gemv.cu", WARPS=8, STAGES=4, NT=2, BLOCKED_PARTS=1, PDL=1)
    add("gemv.cu", WARPS=8, STAGES=4, NT=2, PART_CHUNK=4, RUNS=4)
    add("gemv.cu", WARPS=8, STAGES=4, NT=8, TILES=2, BLOCKED_PARTS=1, NK_PRODUCTS=1, RUNS=4, PDL=1)
    add("gemv.cu", WARPS=1, STAGES=12, GROUPS=4, EPILOGUE=1, NK_PRODUCTS=1)

    # gemm_invariant.cu (batch-invariant steps of many rows): each weight dtype, epilogue and
    # output, split and not, runs, token tiles, warps, stages, PDL
    for w_int8, int8_load in ((0, 16), (1, 16), (1, 8)):
        for epilogue in (0, 1, 2):
            for out_dtype in ("bf16_t", "float"):
                add("gemm_invariant.cu", W_INT8=w_int8, INT8_LOAD=int8_load, EPILOGUE=epilogue,
                    OUT_DTYPE=out_dtype, ROUND_BF16=int(not w_int8 and out_dtype != "float"),
                    PARTS=8, RUNS=1 if epilogue == 1 else 4, SPLIT=int(epilogue != 1),
                    ROW_WARPS=4, STAGES=4, NT=8, STREAM_L2_256B=None, PDL=1)
    add("gemm_invariant.cu", PARTS=16, RUNS=2, SPLIT=0, ROW_WARPS=8, STAGES=2, STAGE_STEPS=4, NT=4)
    add("gemm_invariant.cu", W_INT8=1, EPILOGUE=1, ROUND_BF16=0, PARTS=8, RUNS=1, SPLIT=0,
        STAGES=3, STAGE_STEPS=2, PDL=1)
    add("gemm_invariant.cu", PARTS=4, RUNS=1, SPLIT=0, ROW_WARPS=2, STAGES=3, NT=2, PDL=0)
    add("gemm_invariant.cu", PARTS=8, RUNS=4, SPLIT=1, BLOCKED_PARTS=1, STAGE_STEPS=2, PDL=1)
    add("gemm_invariant.cu", PARTS=8, RUNS=1, SPLIT=0, BLOCKED_PARTS=0, STAGE_STEPS=1)
    add("gemm_invariant.cu", PARTS=8, RUNS=4, SPLIT=1, PART_CHUNK=4, STAGE_STEPS=2, PDL=1)
    add("gemm_invariant.cu", PARTS=8, RUNS=4, SPLIT=1, ROW_TILES=2, STAGE_STEPS=2, PDL=1)
    add("gemm_invariant.cu", W_INT8=1, OUT_DTYPE="float", ROUND_BF16=0, EPILOGUE=2, PARTS=8,
        RUNS=4, SPLIT=0, ROW_TILES=2, NT=4)
    add("gemm_invariant.cu", PARTS=8, RUNS=8, SPLIT=1, BLOCKED_PARTS=1, ROW_WARPS=8, ROW_TILES=2,
        STAGE_STEPS=2, PDL=1)
    add("gemm_invariant.cu", W_INT8=1, EPILOGUE=1, ROUND_BF16=0, PARTS=8, RUNS=2, SPLIT=1, NT=4)
    add("gemm_invariant.cu", PARTS=8, RUNS=4, SPLIT=1, BLOCKED_PARTS=1, NK_PRODUCTS=1,
        STAGE_STEPS=2, PDL=1, K_ALIGNED=1)
    add("gemm_invariant.cu", EPILOGUE=1, PARTS=1, RUNS=1, SPLIT=0, NK_PRODUCTS=1, ROW_WARPS=8,
        NT=2)

    # gemm_wgmma.cu (sm_90a): split and not, warpgroups, n64 and n32, epilogues, outputs, PDL
    add("gemm_wgmma.cu", PARTS=8, RUNS=4, SPLIT=1, WG=1, NT=8, STAGES=4, STREAM_L2_256B=None,
        PDL=1, ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", PARTS=16, RUNS=4, SPLIT=0, WG=2, NT=4, STAGES=3, OUT_DTYPE="float",
        ROUND_BF16=0, ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", PARTS=8, RUNS=1, SPLIT=0, WG=1, NT=8, STAGES=2, ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", EPILOGUE=1, PARTS=1, RUNS=1, SPLIT=0, WG=2, NT=8, STAGES=4, PDL=1,
        ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", EPILOGUE=1, PARTS=8, RUNS=4, SPLIT=1, WG=1, NT=4, STAGES=3,
        ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", EPILOGUE=2, PARTS=8, RUNS=2, SPLIT=1, WG=1, NT=8, STAGES=3,
        ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", PARTS=16, RUNS=4, SPLIT=1, WG=2, NT=8, STAGES=4, TMA=1, PDL=1,
        ARCH_SPECIFIC=None)  # weights by TMA
    add("gemm_wgmma.cu", EPILOGUE=1, PARTS=1, RUNS=1, SPLIT=0, WG=1, NT=4, STAGES=3, TMA=1,
        ARCH_SPECIFIC=None)
    # token groups: 2 x 2 warpgroups split, 4 groups of one, SwiGLU's 2 of one by TMA
    add("gemm_wgmma.cu", PARTS=16, RUNS=4, SPLIT=1, WG=2, TG=2, NT=8, STAGES=4, PDL=1,
        ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", PARTS=8, RUNS=4, SPLIT=1, WG=1, TG=4, NT=8, STAGES=3, TMA=1,
        ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", EPILOGUE=1, PARTS=1, RUNS=1, SPLIT=0, WG=1, TG=2, NT=8, STAGES=3,
        TMA=1, ARCH_SPECIFIC=None)
    # products in flight through the next stage: split by TMA, SwiGLU in one part, n32
    add("gemm_wgmma.cu", PARTS=16, RUNS=4, SPLIT=1, WG=2, NT=8, STAGES=4, TMA=1, MMA_LAG=1,
        PDL=1, ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", EPILOGUE=1, PARTS=1, RUNS=1, SPLIT=0, WG=1, NT=8, STAGES=3, MMA_LAG=1,
        ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", PARTS=8, RUNS=2, SPLIT=1, WG=1, NT=4, STAGES=3, MMA_LAG=1,
        ARCH_SPECIFIC=None)
    # a producer warp beside the products (unsplit, weights by TMA): 2 warpgroups, 2 token
    # groups of one, SwiGLU in one part, xIELU at n32 with PDL, into float
    add("gemm_wgmma_ws.cu", PARTS=8, RUNS=4, WG=2, NT=8, STAGES=4, ARCH_SPECIFIC=None)
    add("gemm_wgmma_ws.cu", EPILOGUE=1, PARTS=1, RUNS=1, WG=1, TG=2, NT=8, STAGES=3,
        STREAM_L2_256B=None, ARCH_SPECIFIC=None)
    add("gemm_wgmma_ws.cu", EPILOGUE=2, PARTS=16, RUNS=4, WG=1, NT=4, STAGES=3, PDL=1,
        ARCH_SPECIFIC=None)
    add("gemm_wgmma_ws.cu", PARTS=8, RUNS=1, WG=1, TG=2, NT=8, STAGES=4, OUT_DTYPE="float",
        ROUND_BF16=0, ARCH_SPECIFIC=None)
    # e4m3 products (W_FP8, ops/gemm_fp8.py): split by TMA in flight, SwiGLU unsplit with token
    # groups, xIELU at n32 by cp.async, into float
    add("gemm_wgmma.cu", W_FP8=1, PARTS=32, RUNS=4, SPLIT=1, WG=1, NT=8, STAGES=4, TMA=1,
        MMA_LAG=1, PDL=1, ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", W_FP8=1, EPILOGUE=1, PARTS=32, RUNS=1, SPLIT=0, WG=1, TG=2, NT=8,
        STAGES=4, TMA=1, STREAM_L2_256B=None, ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", W_FP8=1, EPILOGUE=2, PARTS=112, RUNS=4, SPLIT=1, WG=2, NT=4, STAGES=3,
        ARCH_SPECIFIC=None)
    add("gemm_wgmma.cu", W_FP8=1, PARTS=16, RUNS=1, SPLIT=0, WG=1, NT=8, STAGES=3,
        OUT_DTYPE="float", ROUND_BF16=0, ARCH_SPECIFIC=None)
    # the same products as one stream of stages a block (ops/gemm_fp8_stream.py): warpgroups,
    # n64 and n32, epilogues, outputs, PDL
    add("gemm_fp8_stream.cu", WG=2, NT=8, STAGES=8, PDL=1, ARCH_SPECIFIC=None)
    add("gemm_fp8_stream.cu", WG=1, NT=4, STAGES=3, BOXES=2, EPILOGUE=1, ARCH_SPECIFIC=None)
    add("gemm_fp8_stream.cu", WG=2, NT=8, STAGES=4, BOXES=4, ARCH_SPECIFIC=None)
    add("gemm_fp8_stream.cu", WG=1, NT=8, STAGES=6, EPILOGUE=2, OUT_DTYPE="float", ROUND_BF16=0,
        PDL=1, ARCH_SPECIFIC=None)

    # FP8 (e4m3 weight and x): each epilogue and output, the ring and the register stream, token
    # tiles, row groups, PDL; and the input's quantization
    for epilogue in (0, 1, 2):
        for out_dtype in ("bf16_t", "float"):
            add("gemv.cu", W_FP8=1, INT8_LOAD=16, EPILOGUE=epilogue, OUT_DTYPE=out_dtype,
                ROUND_BF16=0, WARPS=8, STAGES=4)
    add("gemv.cu", W_FP8=1, EPILOGUE=1, ROUND_BF16=0, WARPS=8, STAGES=2, REGS=2, NT=8, TILES=2,
        PDL=1)
    add("gemv.cu", W_FP8=1, ROUND_BF16=0, WARPS=4, STAGES=3, NT=4, GROUPS=2, PDL=1)
    add("fp8_quant.cu", THREADS=256, PDL=1)
    add("fp8_quant.cu", THREADS=1024, PDL=0)
    for items in (1, 2, 7, 8):  # x kept in registers (llama3-8b: K 4096 -> 2, 14336 -> 7)
        add("fp8_quant.cu", THREADS=256, PDL=1, ITEMS=items)

    # gemv_rows.cu: every dtype / epilogue / output, then the tiles, warps, token slots and PDL.
    for w_int8 in (0, 1):
        for epilogue in (0, 1, 2):
            for out_dtype in ("bf16_t", "float"):
                add("gemv_rows.cu", W_INT8=w_int8, EPILOGUE=epilogue, OUT_DTYPE=out_dtype,
                    ROUND_BF16=1 - w_int8, ROWS=2 if epilogue == 1 else 4, UNROLL=2, WARPS=2,
                    TOKENS=1 if out_dtype == "float" else 8)
    for rows, unroll, warps, tokens, pdl in ((1, 4, 1, 1, 1), (8, 1, 4, 1, 0), (4, 3, 8, 3, 1),
                                             (2, 2, 1, 8, 1), (2, 4, 2, 1, 0)):
        add("gemv_rows.cu", ROWS=rows, UNROLL=unroll, WARPS=warps, TOKENS=tokens, PDL=pdl)
    add("gemv_rows.cu", W_INT8=1, EPILOGUE=1, ROUND_BF16=0, ROWS=1, UNROLL=1, WARPS=4, TOKENS=8, PDL=1)

    for w_int8 in (0, 1):
        for out_dtype in ("bf16_t", "float"):
            add("gemm.cu", W_INT8=w_int8, OUT_DTYPE=out_dtype, ROUND_BF16=1 - w_int8)

    # the weight-only FP8 builds (W_E4M3: e4m3 bytes in place of int8) of each linear kernel
    add("gemv_rows.cu", W_INT8=1, W_E4M3=1, EPILOGUE=1, ROUND_BF16=0, ROWS=2, UNROLL=2, WARPS=2,
        TOKENS=8, PDL=1)
    add("gemv.cu", W_INT8=1, W_E4M3=1, EPILOGUE=1, ROUND_BF16=0, WARPS=4, STAGES=2, TILES=2, NT=8)
    add("gemm_invariant.cu", W_INT8=1, W_E4M3=1, EPILOGUE=1, ROUND_BF16=0, PARTS=8, RUNS=2,
        SPLIT=1, NT=4)
    add("gemm.cu", W_INT8=1, W_E4M3=1, OUT_DTYPE="bf16_t", ROUND_BF16=0)
    add("elementwise.cu", W_E4M3=1)

    for head_dim in (64, 128, 256):
        for kv_int8, smooth in ((0, 0), (0, 1), (1, 0), (1, 1)):
            add("attention.cu", HEAD_DIM=head_dim, KV_INT8=kv_int8, SMOOTH=smooth, KV_STAGES=2)
    for kv_int8 in (0, 1):  # deeper rings (the benchmark's sweep), and none (small GPUs)
        add("attention.cu", HEAD_DIM=128, KV_INT8=kv_int8, SMOOTH=0, KV_STAGES=3)
        add("attention.cu", HEAD_DIM=256, KV_INT8=kv_int8, SMOOTH=kv_int8, KV_STAGES=1)

    # attention_decode.cu, with -fmad=false as the ops compile it: every head size, page kind and
    # m-tile count (attention_decode_m_tiles) with the default ring depth (tuning.ATTN_CONFIG's
    # "decode_stages": 2), then the other depths of the benchmark's sweep (the automatic depths,
    # attention_decode_stages, are 3 or 6 at head_dim 128 on an H200, 6 at 64).
    default_depth = 2
    shapes = ((64, 1), (64, 2), (128, 1), (128, 2), (256, 1))  # (head_dim, m_tiles)
    kinds = ((0, 0), (0, 1), (1, 0), (1, 1))  # (kv_int8, smooth)
    decode = lambda **d: add("attention_decode.cu", DECODE_OPTIONS, **d)  # noqa: E731
    for head_dim, m_tiles in shapes:
        for kv_int8, smooth in kinds:
            decode(HEAD_DIM=head_dim, KV_INT8=kv_int8, SMOOTH=smooth, M_TILES=m_tiles,
                   KV_STAGES=default_depth)
    for head_dim, depths in ((128, (1, 3, 4, 6)), (64, (3, 4, 6))):
        for kv_int8 in (0, 1):
            for depth in depths:
                decode(HEAD_DIM=head_dim, KV_INT8=kv_int8, SMOOTH=0, M_TILES=2, KV_STAGES=depth)
    # the tuning defines at a value other than their default
    decode(HEAD_DIM=128, KV_INT8=1, SMOOTH=0, M_TILES=2, KV_STAGES=2, COMBINE_BATCH=32, MIN_SPLIT_TILES=4)

    decode(HEAD_DIM=128, KV_INT8=0, SMOOTH=0, M_TILES=2, KV_STAGES=3, PDL_TRIGGER=1)
    # batch-invariant steps: fixed 256-key splits, every page kind, fused inputs too
    for kv_int8, smooth in kinds:
        decode(HEAD_DIM=128, KV_INT8=kv_int8, SMOOTH=smooth, M_TILES=2, KV_STAGES=6,
               SPLIT_KEYS=256, PDL_TRIGGER=1)
    decode(HEAD_DIM=64, KV_INT8=0, SMOOTH=0, M_TILES=1, KV_STAGES=6, SPLIT_KEYS=256,
           PDL_TRIGGER=1, FUSED_INPUTS=1)
    # with the attention inputs fused (attention_with_inputs), as the ops launch them (the PDL
    # trigger after the loop), also with a one-stage ring
    for head_dim, m_tiles in shapes:
        for kv_int8, smooth in kinds:
            decode(HEAD_DIM=head_dim, KV_INT8=kv_int8, SMOOTH=smooth, M_TILES=m_tiles,
                   KV_STAGES=default_depth, PDL_TRIGGER=1, FUSED_INPUTS=1)
    decode(HEAD_DIM=128, KV_INT8=1, SMOOTH=1, M_TILES=2, KV_STAGES=1, FUSED_INPUTS=1)

    add("sampling.cu", SAMPLING_OPTIONS)
    return out

