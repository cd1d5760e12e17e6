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
// ITEMS > 0 (K <= ITEMS * THREADS * 8): each thread keeps its ITEMS chunks of x in registers
// between the maximum and the quantization, so x is read once (a decode step waits for this
// kernel: its latency is the step's). ITEMS = 0 reads x twice, for any K. The same chunks per
// thread and the same arithmetic either way, so the same bits.
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
#ifndef ITEMS
#define ITEMS 0
#endif

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
#if ITEMS
    uint4 v[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int k = (i * THREADS + threadIdx.x) * 8;
        v[i] = k < K ? *reinterpret_cast<const uint4*>(row + k) : make_uint4(0, 0, 0, 0);
        amax = fmaxf(amax, chunk_amax(v[i]));
    }
#else
    for (int k = threadIdx.x * 8; k < K; k += THREADS * 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(row + k);  // one 16-byte load
        amax = fmaxf(amax, chunk_amax(v));
    }
#endif
    amax = block_max(amax, scratch);  // common.cuh
    const float scale = row_scale(amax);  // fp8.cuh
    if (threadIdx.x == 0) x_scale[blockIdx.x] = scale;
#if ITEMS
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
        const int k = (i * THREADS + threadIdx.x) * 8;
        if (k < K) *reinterpret_cast<uint2*>(out + k) = chunk_e4m3(v[i], scale);
    }
#else
    for (int k = threadIdx.x * 8; k < K; k += THREADS * 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(row + k);
        *reinterpret_cast<uint2*>(out + k) = chunk_e4m3(v, scale);
    }
#endif
}
