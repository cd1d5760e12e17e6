// L2 prefetch of a decode GEMV's weight, issued before pdl_wait: while the previous kernel (a
// norm, the decode attention) still runs, a GEMV launched early by PDL asks the memory system
// for weight bytes beyond those its prologue copies, so that the latency-bound kernels between
// the GEMVs overlap with the weight stream. A prefetch is a hint (cp.async.bulk.prefetch.L2,
// sm_90; nothing before): no value changes, only where the GEMV's loads find their bytes.
//
// L2_PREFETCH: bytes of each of the block's weight rows to prefetch, past the first `skip`
// bytes (those the prologue copies); 0: none. L2_AHEAD: 0, or a distance in blocks: block b
// also prefetches the first L2_PREFETCH bytes of block b + L2_AHEAD's rows (a grid of several
// waves: the first wave's blocks, resident early, fetch for the second).
#pragma once
#include "common.cuh"

#ifndef L2_PREFETCH
#define L2_PREFETCH 0
#endif
#ifndef L2_AHEAD
#define L2_AHEAD 0
#endif

// Bytes [from, to) at p, rounded inward to 16 bytes, in bulk prefetches of at most 32 KB.
__device__ __forceinline__ void prefetch_l2(const char* p, i64 from, i64 to) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const u64 lo = ((u64)(p + from) + 15) & ~(u64)15, hi = (u64)(p + to) & ~(u64)15;
    for (u64 at = lo; at < hi; at += 32768) {
        const u32 n = (u32)min((u64)32768, hi - at);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(at), "r"(n) : "memory");
    }
#endif
}

// The rows [row_base, row_base + rows) (clipped to o_rows) of each of `mats` matrices of o_rows
// rows, row_bytes apart: bytes [lo + skip, lo + skip + L2_PREFETCH) of each, within [lo, hi).
// The block's threads take one row each.
__device__ __forceinline__ void prefetch_rows_l2(const void* w, i64 row_bytes, int o_rows,
                                                 int mats, int row_base, int rows, i64 lo,
                                                 i64 hi, i64 skip) {
    const int items = mats * rows;
    const int threads = blockDim.x * blockDim.y;
    for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < items; i += threads) {
        const int row = row_base + i % rows;
        if (row >= o_rows) continue;
        const char* p = static_cast<const char*>(w) + ((i64)(i / rows) * o_rows + row) * row_bytes;
        prefetch_l2(p, lo + skip, min(hi, lo + skip + (i64)L2_PREFETCH));
    }
}

// A block's prefetch: its own rows past `skip`, then (L2_AHEAD) block block + L2_AHEAD's from
// their start, where that block exists.
__device__ __forceinline__ void prefetch_block_l2(const void* w, i64 row_bytes, int o_rows,
                                                  int mats, int block, int rows, i64 lo,
                                                  i64 hi, i64 skip) {
    if (L2_PREFETCH == 0) return;
    prefetch_rows_l2(w, row_bytes, o_rows, mats, block * rows, rows, lo, hi, skip);
    if (L2_AHEAD > 0)
        prefetch_rows_l2(w, row_bytes, o_rows, mats, (block + L2_AHEAD) * rows, rows, lo, hi, 0);
}
