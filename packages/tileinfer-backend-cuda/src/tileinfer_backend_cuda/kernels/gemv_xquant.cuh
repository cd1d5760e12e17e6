// gemv.cu's X_QUANT build (W_FP8 only): x arrives as bf16 (n <= TOKENS rows) and every block
// quantizes the rows itself, as fp8_quant.cu does (the same row maximum, scale and IEEE
// divisions, fp8.cuh, so the same bytes and scales), into shared memory past the ring; the steps
// then read their x chunks from there, and the ring holds the weight only. A step of few rows
// saves its quantization launch and the wait for it (the rows are few, and every block reads
// them from L2). Included after gemv.cu's defines and constants.
#pragma once

static_assert(!X_QUANT || (W_FP8 && !REGS && !NK_PRODUCTS), "X_QUANT: the FP8 ring build");

// Bytes past each quantized row in shared memory: rows 64 bytes apart in the banks, so that the
// two rows of a quarter warp's 16-byte reads (lanes 8q .. 8q + 7: rows 2q, 2q + 1, 64 bytes of
// each) fall in different banks.
constexpr int XS_PAD = 64;
// Where xs starts in the dynamic shared memory: past the ring and the partial sums that reuse it.
constexpr int XS_RING = THREADS / 32 * STAGES * PARTS * 32 * 16;
constexpr int XS_PARTIAL = THREADS / 32 * WT * 16 * (TOKENS + 1) * 4;
constexpr int XS_OFFSET = XS_RING > XS_PARTIAL ? XS_RING : XS_PARTIAL;

// The 16 e4m3 of x row `row` at k + t * LANE_K (k 0 where the lane's chunk holds no data: finite
// values times the zero-filled weight chunk).
__device__ __forceinline__ uint4 xs_chunk(const unsigned char* xs, int row, int K, int k, bool valid,
                                          int t) {
    return *reinterpret_cast<const uint4*>(xs + (i64)row * (K + XS_PAD) + (valid ? k : 0) +
                                           t * LANE_K);
}

// x rows r < n (bf16, x_stride elements apart) quantized per row into xs (e4m3, K + XS_PAD bytes
// apart) with their scales in x_scale; red: THREADS / 32 floats a row. Ends with the block in step.
__device__ __forceinline__ void quantize_x_rows(unsigned char* xs, float* x_scale, float* red,
                                                const bf16_t* __restrict__ x, int n, int K,
                                                i64 x_stride) {
    constexpr int BLOCK_WARPS = THREADS / 32;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (int r = 0; r < n; ++r) {
        float amax = 0.0f;
        for (int k = threadIdx.x * 8; k < K; k += THREADS * 8)
            amax = fmaxf(amax, chunk_amax(__ldg(reinterpret_cast<const uint4*>(x + r * x_stride + k))));
        amax = warp_max(amax);
        if (lane == 0) red[r * BLOCK_WARPS + wid] = amax;
    }
    __syncthreads();
    for (int r = 0; r < n; ++r) {
        float amax = 0.0f;  // the row's maximum: the same value in any order
        for (int w = 0; w < BLOCK_WARPS; ++w) amax = fmaxf(amax, red[r * BLOCK_WARPS + w]);
        const float scale = row_scale(amax);
        if (threadIdx.x == 0) x_scale[r] = scale;
        for (int k = threadIdx.x * 8; k < K; k += THREADS * 8)
            *reinterpret_cast<uint2*>(xs + (i64)r * (K + XS_PAD) + k) =
                chunk_e4m3(__ldg(reinterpret_cast<const uint4*>(x + r * x_stride + k)), scale);
    }
    __syncthreads();
}
