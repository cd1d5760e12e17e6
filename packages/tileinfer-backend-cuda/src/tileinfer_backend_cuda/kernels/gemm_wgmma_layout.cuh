// gemm_wgmma.cu's shared-memory layout and walk over K, integer arithmetic alone (checked on the
// host: tests/tileinfer-backend-cuda/test_cuda_wgmma_layout.py, against the PTX description of
// wgmma's descriptors and against gemv_parts.cuh's walk).
//
// A ring stage holds 64 k (128 bytes) of each of its rows (the block's weight rows, or its
// tokens) in wgmma's K-major layout with the 128-byte swizzle: row r in the 128 bytes from
// r 128, its chunk c (k 8c .. 8c + 7) at 16-byte position c ^ (r % 8) among them. The swizzle
// is on the shared address itself, so each region starts on 1024 bytes (8 rows).
#pragma once

constexpr int WGMMA_ALIGN = 1024;  // a region's alignment: one period of the swizzle

// Byte offset of row r's chunk c in a region.
__device__ __forceinline__ u32 wgmma_cell(int r, int c) {
    return (u32)(r * 128 + ((c ^ (r & 7)) << 4));
}

// The row and chunk that copy q of a stage takes: 8 neighbouring q take one row's 8 chunks, so
// a quarter warp reads 128 neighbouring bytes of a row and writes one 128-byte row of the stage
// (its 8 chunks in 8 different bank groups).
struct WgmmaChunk {
    int row, chunk;
};
__device__ __forceinline__ WgmmaChunk wgmma_chunk(int q) {
    return {q >> 3, q & 7};
}

// A shared-memory operand descriptor: start address, leading byte offset (not read for a
// K-major swizzled operand whose k fit in the swizzle's row: set to 16 bytes), stride byte
// offset (between groups of 8 rows: 1024 bytes), each in 16-byte units in bits 0-13, 16-29
// and 32-45; layout 1 (128-byte swizzle) in bits 62-63; base offset 0 (bits 49-51: the
// regions are aligned).
__device__ __forceinline__ unsigned long long wgmma_desc(u32 addr) {
    return (unsigned long long)((addr >> 4) & 0x3FFF) | (1ull << 16)
           | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

// The operand of product kk (k 16 kk .. 16 kk + 15 of the stage) for the rows from row0 (a
// multiple of 8) of the region at shared address `region`: wgmma applies the swizzle to the
// start plus each row's offset, so the product's k are its 32 bytes from 32 kk.
__device__ __forceinline__ unsigned long long wgmma_operand(u32 region, int kk, int row0) {
    return wgmma_desc(region + (u32)(row0 * 128 + kk * 32));
}

// The K steps (32 k each) a block adds, [first, last), when it adds the contiguous parts
// [part_lo, part_hi) of `parts` (BLOCKED_PARTS, or one part): part p takes the steps p per ..
// p per + per - 1 (per = ceil(steps / parts)), so step s belongs to part s / per.
struct WgmmaSteps {
    int first, last, per;
};
__device__ __forceinline__ WgmmaSteps wgmma_steps(int part_lo, int part_hi, int steps,
                                                  int parts) {
    const int per = (steps + parts - 1) / parts;
    return {min(steps, part_lo * per), min(steps, part_hi * per), per};
}
