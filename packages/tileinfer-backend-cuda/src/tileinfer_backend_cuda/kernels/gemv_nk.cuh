// Products of neighbouring k (NK_PRODUCTS = 1; bf16 weights): another order of a row's sum for
// gemv.cu's and gemm_invariant.cu's batch-invariant builds, which read their fragments with
// ldmatrix. Included after gemv_frag.cuh.
//
// By default (gemv_frag.cuh) a lane feeds the mma's its own 16 bytes of a row, k 8t .. 8t + 7 of
// a 32-k step: the first four k to the step's product 0, the last four to product 1, so product
// 0 adds k {0-3, 8-11, 16-19, 24-27}. Its A fragment pairs rows g and g + 8 word by word out of
// two 16-byte loads, which costs register moves before every mma. Here product p adds the
// neighbouring k 16p .. 16p + 15 (the mma's own layout), and ldmatrix hands every lane its
// fragments from the same 16-byte cells (a lane's chunk t of row g, or of token g): the A
// fragment of a 16-row tile from its two parts (rows g, rows g + 8), the B fragments of a token
// tile from its part, with no moves. The sums differ from the default order's; every build of a
// weight takes the same order (gemm_invariant.py: INVARIANT_ORDER's "nk").
//
// A lane's cells are then read by other lanes: each part's 32 cells (512 bytes) hold lane
// (g, t)'s chunk at cell nk_cell(g, t), t swizzled by g / 2, so that the eight rows of a matrix
// (one chunk of rows 0..7) sit in eight different bank groups.
#pragma once

#ifndef NK_PRODUCTS
#define NK_PRODUCTS 0
#endif
static_assert(!NK_PRODUCTS || (!W_INT8 && !W_FP8), "NK_PRODUCTS: bf16 weights");

__device__ __forceinline__ int nk_cell(int g, int t) { return 4 * g + (t ^ ((g >> 1) & 3)); }

// This lane's ldmatrix rows as byte offsets (nk_lane, once a kernel): a[p] from a 16-row
// tile's first part (rows g; rows g + 8: the next part, 512 bytes on), b from a token tile's.
// ldmatrix.x4: lane i gives row i % 8 of matrix i / 8. A's matrices of product p: (rows 0-7,
// chunk 2p), (rows 8-15, chunk 2p), (rows 0-7, chunk 2p + 1), (rows 8-15, chunk 2p + 1): a0..a3;
// B's: chunks 0..3 of tokens 0-7, product p taking b[2p], b[2p + 1].
struct NkLane {
    u32 a[2], b;
};
__device__ __forceinline__ NkLane nk_lane(int lane) {
    const int mi = lane >> 3, r = lane & 7;
    NkLane l;
#pragma unroll
    for (int p = 0; p < 2; ++p) l.a[p] = (mi & 1) * 512 + nk_cell(r, 2 * p + (mi >> 1)) * 16;
    l.b = nk_cell(r, mi) * 16;
    return l;
}

// The A fragments of one step of the 16-row tile whose first part is at shared address tile.
__device__ __forceinline__ void nk_a(u32 (&a)[2][4], u32 tile, const NkLane& l) {
#pragma unroll
    for (int p = 0; p < 2; ++p) ldmatrix_x4(a[p][0], a[p][1], a[p][2], a[p][3], tile + l.a[p]);
}

// The B fragments of one step of the token tile whose x is the part at shared address px.
__device__ __forceinline__ void nk_b(u32 (&b)[4], u32 px, const NkLane& l) {
    ldmatrix_x4(b[0], b[1], b[2], b[3], px + l.b);
}

// acc += the step's two products, in order.
__device__ __forceinline__ void nk_mma(float (&acc)[4], const u32 (&a)[2][4], const u32 (&b)[4]) {
#pragma unroll
    for (int p = 0; p < 2; ++p)
        mma_bf16_16816(acc, a[p][0], a[p][1], a[p][2], a[p][3], b[2 * p], b[2 * p + 1]);
}
