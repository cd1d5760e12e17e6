// gemm_wgmma.cu's shared-memory layout and walk over K, integer arithmetic alone (checked on the
// host: tests/tileinfer-backend-cuda/test_cuda_wgmma_layout.py, against the PTX description of
// wgmma's descriptors and against gemv_parts.cuh's walk).
//
// A ring stage holds 64 k of `rows` rows (the block's weight rows, or its tokens) in K-major core
// matrices of 8 rows x 8 k, no swizzle: chunk c (k 8c .. 8c + 7) of row r at wgmma_cell(r, c).
#pragma once

// Byte offset of row r's chunk c in a region of `rows` rows: the chunks c of all rows together.
__device__ __forceinline__ u32 wgmma_cell(int r, int c, int rows) {
    return (u32)(c * rows * 16 + r * 16);
}

// The row and chunk that copy q of a stage takes (q < 8 rows): 32 neighbouring q take 8 rows
// (q % 8) x 4 chunks (q / 8 % 4) of row group q / 64 and chunk half q / 32 % 2. A quarter warp
// writes one chunk of 8 rows, 128 neighbouring bytes (no bank conflict); a warp reads 64
// neighbouring bytes of each of 8 rows.
struct WgmmaChunk {
    int row, chunk;
};
__device__ __forceinline__ WgmmaChunk wgmma_chunk(int q) {
    return {(q >> 6) * 8 + (q & 7), ((q >> 5) & 1) * 4 + ((q >> 3) & 3)};
}

// A shared-memory operand descriptor: start address, leading byte offset (between the core
// matrices of k 0..7 and 8..15), stride byte offset (between core matrices of 8 rows), each in
// 16-byte units in bits 0-13, 16-29 and 32-45; layout 0 (no swizzle) in bits 62-63.
__device__ __forceinline__ unsigned long long wgmma_desc(u32 addr, u32 lead, u32 stride) {
    return (unsigned long long)((addr >> 4) & 0x3FFF)
           | ((unsigned long long)((lead >> 4) & 0x3FFF) << 16)
           | ((unsigned long long)((stride >> 4) & 0x3FFF) << 32);
}

// The operand of product kk (k 16 kk .. 16 kk + 15 of the stage) for the rows from row0 of a
// region of `rows` rows at shared address `region`.
__device__ __forceinline__ unsigned long long wgmma_operand(u32 region, int kk, int row0,
                                                            int rows) {
    return wgmma_desc(region + wgmma_cell(row0, 2 * kk, rows), (u32)(rows * 16), 128u);
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
