// gemv.cu's X_QUANT build (FP8): the input's bf16 rows quantized inside the GEMV, as
// fp8_quant.cu quantizes them (tileinfer/backend/fp8.py defines it): a row's scale from its
// largest |value| (x_row_scales), each value divided by it and rounded to e4m3 (x_e4m3). The
// arithmetic is fp8.cuh's, which fp8_quant.cu runs, so the bits are its launch's.
#pragma once
#include "fp8.cuh"

// The scales of x's n token rows (n <= TOKENS, K % 8 == 0) into `scales` (shared memory), every
// thread of the block taking 16-byte chunks; amax_bits: TOKENS ints of shared memory, zero
// before the call. A row's maximum gathers as float bits: non-negative floats order as their
// bits do, so atomicMax of the bits is the largest value whatever the order. Returns after a
// barrier: every thread may read `scales`.
template <int TOKENS>
__device__ __forceinline__ void x_row_scales(float* scales, int* amax_bits,
                                             const bf16_t* __restrict__ x, int n, int K,
                                             i64 x_stride) {
    float amax[TOKENS];
#pragma unroll
    for (int tok = 0; tok < TOKENS; ++tok) amax[tok] = 0.0f;
    for (int k = threadIdx.x * 8; k < K; k += blockDim.x * 8)
#pragma unroll
        for (int tok = 0; tok < TOKENS; ++tok)  // every row's chunk requested before any max
            if (tok < n)
                amax[tok] = fmaxf(amax[tok], chunk_amax(__ldg(
                    reinterpret_cast<const uint4*>(x + tok * x_stride + k))));
#pragma unroll
    for (int tok = 0; tok < TOKENS; ++tok) {
        if (tok >= n) break;
        float m = amax[tok];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if ((threadIdx.x & 31) == 0) atomicMax(amax_bits + tok, __float_as_int(m));
    }
    __syncthreads();
    if (threadIdx.x < n) scales[threadIdx.x] = row_scale(__int_as_float(amax_bits[threadIdx.x]));
    __syncthreads();
}

// A lane's 16 x values (two 16-byte cells of bf16, k order) as 16 e4m3 bytes in that order.
__device__ __forceinline__ uint4 x_e4m3(const uint4 (&cells)[2], float scale) {
    const uint2 lo = chunk_e4m3(cells[0], scale), hi = chunk_e4m3(cells[1], scale);
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
}
