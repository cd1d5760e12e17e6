// gemv.cu's X_QUANT build (FP8): the input's bf16 rows quantized once a block into shared
// memory, as fp8_quant.cu quantizes them (tileinfer/backend/fp8.py defines it): a row's scale
// from its largest |value|, each value divided by it and rounded to e4m3. The arithmetic is
// fp8.cuh's, which fp8_quant.cu runs, so the bytes and scales are its launch's.
#pragma once
#include "fp8.cuh"

// x's n rows (K % 256 == 0) into xq (shared memory, n x K e4m3 bytes, row-major) and their
// scales into `scales` (shared). Chunk c of the n K / 8 16-byte chunks (row c / (K / 8)) is
// thread threadIdx.x + i blockDim.x's i-th, held in registers between the maximum and the
// rounding (ITEMS >= n K / (8 blockDim.x)). A warp's 32 chunks lie in one row (K / 8 is a multiple
// of 32), so the warp reduces its maximum at once; rows' maxima gather as float bits in
// amax_bits (shared, zero before the call): non-negative floats order as their bits do, so
// atomicMax of the bits is the largest value whatever the order. Returns after a barrier.
template <int ITEMS>
__device__ __forceinline__ void quantize_x_rows(unsigned char* xq, float* scales,
                                                unsigned* amax_bits, const bf16_t* __restrict__ x,
                                                int n, int K, i64 x_stride) {
    const int row_chunks = K / 8, chunks = n * row_chunks;
    uint4 v[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {  // every load first
        const int c = threadIdx.x + i * blockDim.x;
        v[i] = c < chunks ? __ldg(reinterpret_cast<const uint4*>(
                                x + c / row_chunks * x_stride + c % row_chunks * 8))
                          : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c >= chunks) break;  // the whole warp
        const unsigned m = __reduce_max_sync(0xffffffffu, __float_as_uint(chunk_amax(v[i])));
        if ((threadIdx.x & 31) == 0) atomicMax(amax_bits + c / row_chunks, m);
    }
    __syncthreads();
    if (threadIdx.x < n) scales[threadIdx.x] = row_scale(__uint_as_float(amax_bits[threadIdx.x]));
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int c = threadIdx.x + i * blockDim.x;
        if (c < chunks)
            *reinterpret_cast<uint2*>(xq + (i64)c * 8) = chunk_e4m3(v[i], scales[c / row_chunks]);
    }
    __syncthreads();
}
