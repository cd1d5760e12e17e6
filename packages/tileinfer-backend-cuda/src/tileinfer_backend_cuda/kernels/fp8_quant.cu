// Per-token e4m3 quantization of a linear layer's input (tileinfer/backend/fp8.py defines it):
//   x_scale[i] = max|x[i]| / 448 (1 for an all-zero row)
//   xq[i][k]   = e4m3(clamp(x[i][k] / x_scale[i], -448, 448)), rounded to nearest even
// with IEEE float32 divisions (NVRTC's default -prec-div=true), so the values are the ref
// backend's bit for bit.
//
// Grid: one block per row; block: THREADS threads, each taking 8 elements (16 bytes of x) at a
// time. x (n, K) bf16 with row stride x_stride (elements), K % 8 == 0, rows 16-byte aligned;
// xq (n, K) e4m3, contiguous; x_scale (n,) float32.
//
// PDL = 1 (launched with programmatic dependent launch): the next kernel (the GEMV, whose
// prologue prefetches its weight) may start at once; this one waits for the previous kernel
// before it reads x or writes xq (which that kernel, the previous GEMV, may still be reading).
#include "fp8.cuh"

#ifndef THREADS
#define THREADS 256
#endif
#ifndef PDL
#define PDL 0
#endif

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < THREADS / 32 ? scratch[lane] : 0.0f;
    return warp_max(v);
}

extern "C" __global__ void __launch_bounds__(THREADS)
quantize_rows(unsigned char* __restrict__ xq, float* __restrict__ x_scale,
              const bf16_t* __restrict__ x, int K, i64 x_stride) {
    __shared__ float scratch[32];
#if PDL
    pdl_launch_dependents();
    pdl_wait();
#endif
    const bf16_t* row = x + blockIdx.x * x_stride;
    unsigned char* out = xq + (i64)blockIdx.x * K;
    float amax = 0.0f;
    for (int k = threadIdx.x * 8; k < K; k += THREADS * 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(row + k);
        const u32* p = reinterpret_cast<const u32*>(&v);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            amax = fmaxf(amax, fmaxf(fabsf(bf16_lo(p[i])), fabsf(bf16_hi(p[i]))));
    }
    amax = block_max(amax, scratch);
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    if (threadIdx.x == 0) x_scale[blockIdx.x] = scale;
    for (int k = threadIdx.x * 8; k < K; k += THREADS * 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(row + k);
        const u32* p = reinterpret_cast<const u32*>(&v);
        u32 packed[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 b0 = float2_to_e4m3x2(bf16_lo(p[2 * i]) / scale, bf16_hi(p[2 * i]) / scale);
            const u32 b1 = float2_to_e4m3x2(bf16_lo(p[2 * i + 1]) / scale,
                                            bf16_hi(p[2 * i + 1]) / scale);
            packed[i] = b0 | (b1 << 16);
        }
        *reinterpret_cast<uint2*>(out + k) = make_uint2(packed[0], packed[1]);
    }
}
