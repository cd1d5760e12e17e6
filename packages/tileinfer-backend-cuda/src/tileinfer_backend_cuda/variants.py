"""Representative builds of every kernel file: each define of each file takes each of its values
at least once. CI compiles all of them to cubins (no GPU needed); ``warm_cache`` compiles them
into the disk cache ahead of a run.

A build is ``(file, defines, extra_options)`` as ``compiler.compile_cubin`` takes them.
"""

from __future__ import annotations

SAMPLING_OPTIONS = ("-fmad=false",)


def builds() -> list[tuple[str, dict, tuple]]:
    out: list[tuple[str, dict, tuple]] = []
    add = lambda file, extra=(), **defines: out.append((file, defines, extra))  # noqa: E731

    for dtype, vec in (("bf16_t", 8), ("f16_t", 8), ("float", 4), ("bf16_t", 1)):
        add("elementwise.cu", DTYPE=dtype, VEC=vec)
        add("norm.cu", DTYPE=dtype, VEC=vec)
    add("elementwise.cu", VEC16=None)
    add("norm.cu", DTYPE="bf16_t", WEIGHT_DTYPE="float", VEC=4)

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
    for w_int8, epilogue in ((0, 0), (1, 1)):  # programmatic dependent launch (ops.PDL)
        add("gemv.cu", W_INT8=w_int8, EPILOGUE=epilogue, ROUND_BF16=1 - w_int8, WARPS=8, STAGES=8, PDL=1)
    add("gemv.cu", WARPS=4, STAGES=2, PDL=1)
    add("gemv.cu", WARPS=2, STAGES=3)

    for w_int8 in (0, 1):
        for out_dtype in ("bf16_t", "float"):
            add("gemm.cu", W_INT8=w_int8, OUT_DTYPE=out_dtype, ROUND_BF16=1 - w_int8)

    for head_dim in (64, 128, 256):
        for kv_int8, smooth in ((0, 0), (0, 1), (1, 0), (1, 1)):
            add("attention.cu", HEAD_DIM=head_dim, KV_INT8=kv_int8, SMOOTH=smooth, KV_STAGES=2)
    for kv_int8 in (0, 1):  # deeper rings (the benchmark's sweep), and none (small GPUs)
        add("attention.cu", HEAD_DIM=128, KV_INT8=kv_int8, SMOOTH=0, KV_STAGES=3)
        add("attention.cu", HEAD_DIM=256, KV_INT8=kv_int8, SMOOTH=kv_int8, KV_STAGES=1)

    add("sampling.cu", SAMPLING_OPTIONS)
    return out


def warm_cache(arch: str = "sm_90") -> int:
    """Compile every representative build into the disk cache; returns how many were compiled."""
    from . import compiler

    before = compiler.stats.compiled
    for file, defines, extra in builds():
        compiler.compile_cubin(file, arch, defines, extra)
    return compiler.stats.compiled - before
