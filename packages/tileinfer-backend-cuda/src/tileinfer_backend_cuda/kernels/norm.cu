// RMSNorm and the fused residual add + RMSNorm, with the two roundings of transformers'
// LlamaRMSNorm: x_hat = x * rsqrt(mean(x^2) + eps) rounded to T, then weight (as T) * x_hat
// rounded to T; or (GEMMA) Gemma3RMSNorm's: x * rsqrt(mean(x^2) + eps) * weight in float32
// (a float32 weight, 1 + w), rounded once to T.
//
// Layout: rows of `dim` contiguous elements (row r at r * dim). Two shapes of work:
//   *_block: one block per row (large dims, e.g. hidden 4096), a block-wide reduction;
//   *_warp:  one warp per row, blockDim.x / 32 rows per block (head_dim rows of q/k norms).
// Both read the row twice (the second read hits L1/L2): the first pass sums squares (and for
// add_rmsnorm writes the updated residual), the second normalizes.
//
// E4M3_OUT = 1 (bf16 rows, VEC 8, sm_89 and newer) adds add_rmsnorm_e4m3_*: add_rmsnorm, then
// out's rows quantized per row for an FP8 product (tileinfer/backend/fp8.py) with fp8_quant.cu's
// arithmetic on its chunks of 8 (fp8.cuh), into out_q (rows, dim) e4m3 and out_scale (rows,)
// float32: the bits of the quantization launch, without its launch.
//
// Defines: DTYPE (activation type T), WEIGHT_DTYPE (weight type W_T), VEC (elements per access;
// dim % VEC == 0), GEMMA (0/1), E4M3_OUT (0/1).
#include "common.cuh"

#ifndef DTYPE
#define DTYPE bf16_t
#endif
#ifndef WEIGHT_DTYPE
#define WEIGHT_DTYPE DTYPE
#endif
#ifndef VEC
#define VEC 1
#endif
#ifndef GEMMA
#define GEMMA 0
#endif
#ifndef E4M3_OUT
#define E4M3_OUT 0
#endif
typedef DTYPE T;
typedef WEIGHT_DTYPE W_T;

// Normalize chunks [first, dim/VEC) step `stride` of one row once its inverse rms is known.
__device__ __forceinline__ void normalize_row(T* out, const T* x, const W_T* weight, int dim,
                                              float inv_rms, int first, int stride) {
    for (int c = first; c < dim / VEC; c += stride) {
        float v[VEC], w[VEC], o[VEC];
        load_chunk<T, VEC>(x + c * VEC, v);
        load_chunk<W_T, VEC>(weight + c * VEC, w);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            o[e] = GEMMA ? v[e] * inv_rms * w[e] : round_to<T>(w[e]) * round_to<T>(v[e] * inv_rms);
        store_chunk<T, VEC>(out + c * VEC, o);
    }
}

// Sum of squares of chunks [first, dim/VEC) step `stride`; with delta, first x += delta
// (rounded to T, written back to x) and the updated values are squared.
template <bool ADD>
__device__ __forceinline__ float square_sum(T* x, const T* delta, int dim, int first, int stride) {
    float acc = 0.0f;
    for (int c = first; c < dim / VEC; c += stride) {
        float v[VEC];
        load_chunk<T, VEC>(x + c * VEC, v);
        if (ADD) {
            float d[VEC];
            load_chunk<T, VEC>(delta + c * VEC, d);
#pragma unroll
            for (int e = 0; e < VEC; ++e) v[e] = round_to<T>(v[e] + d[e]);
            store_chunk<T, VEC>(x + c * VEC, v);
        }
#pragma unroll
        for (int e = 0; e < VEC; ++e) acc += v[e] * v[e];
    }
    return acc;
}

template <bool ADD>
__device__ __forceinline__ void norm_block(T* out, T* x, const T* delta, const W_T* weight,
                                           int dim, float eps) {
    __shared__ float scratch[32];
    const i64 row = blockIdx.x;
    x += row * dim;
    out += row * dim;
    if (ADD) delta += row * dim;
    float ss = square_sum<ADD>(x, delta, dim, threadIdx.x, blockDim.x);
    ss = block_sum(ss, scratch);
    const float inv_rms = rsqrtf(ss / (float)dim + eps);
    normalize_row(out, x, weight, dim, inv_rms, threadIdx.x, blockDim.x);
}

template <bool ADD>
__device__ __forceinline__ void norm_warp(T* out, T* x, const T* delta, const W_T* weight,
                                          i64 rows, int dim, float eps) {
    const i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    x += row * dim;
    out += row * dim;
    if (ADD) delta += row * dim;
    const float ss = warp_sum(square_sum<ADD>(x, delta, dim, lane, 32));
    const float inv_rms = rsqrtf(ss / (float)dim + eps);
    normalize_row(out, x, weight, dim, inv_rms, lane, 32);
}

// rmsnorm: out (rows, dim) = rmsnorm(x) * weight. out may be x.
extern "C" __global__ void rmsnorm_block(T* out, const T* x, const W_T* __restrict__ weight,
                                         int dim, float eps) {
    pdl_launch_dependents();  // PDL (common.cuh): the next kernel may start its launch now
    pdl_wait();               // ... and this one reads nothing before the previous one is done
    norm_block<false>(out, const_cast<T*>(x), nullptr, weight, dim, eps);
}
extern "C" __global__ void rmsnorm_warp(T* out, const T* x, const W_T* __restrict__ weight,
                                        i64 rows, int dim, float eps) {
    pdl_launch_dependents();
    pdl_wait();
    norm_warp<false>(out, const_cast<T*>(x), nullptr, weight, rows, dim, eps);
}

// add_rmsnorm: residual += delta (rounded to T), then out = rmsnorm(residual) * weight.
extern "C" __global__ void add_rmsnorm_block(T* residual, T* out, const T* delta,
                                             const W_T* __restrict__ weight, int dim, float eps) {
    pdl_launch_dependents();  // the next GEMV may start prefetching its weight (see common.cuh)
    pdl_wait();
    norm_block<true>(out, residual, delta, weight, dim, eps);
}
extern "C" __global__ void add_rmsnorm_warp(T* residual, T* out, const T* delta,
                                            const W_T* __restrict__ weight, i64 rows, int dim,
                                            float eps) {
    pdl_launch_dependents();
    pdl_wait();
    norm_warp<true>(out, residual, delta, weight, rows, dim, eps);
}

#if E4M3_OUT
#include "fp8.cuh"
static_assert(VEC == 8, "E4M3_OUT reads the chunks of 8 that normalize_row wrote");

// Quantize a row of out that this group of threads (a block, or a warp: BLOCK) has just
// written: each thread reads back the very chunks it wrote (VEC 8: the same chunk indices), so
// no barrier is needed before the maximum.
template <bool BLOCK>
__device__ __forceinline__ void quantize_row(unsigned char* q, float* scale_out, const T* out,
                                             int dim, int first, int stride, float* scratch) {
    float amax = 0.0f;
    for (int k = first * 8; k < dim; k += stride * 8)
        amax = fmaxf(amax, chunk_amax(*reinterpret_cast<const uint4*>(out + k)));
    amax = BLOCK ? block_max(amax, scratch) : warp_max(amax);
    const float scale = row_scale(amax);  // fp8.cuh
    if (first == 0) *scale_out = scale;
    for (int k = first * 8; k < dim; k += stride * 8)
        *reinterpret_cast<uint2*>(q + k) =
            chunk_e4m3(*reinterpret_cast<const uint4*>(out + k), scale);
}

extern "C" __global__ void add_rmsnorm_e4m3_block(T* residual, T* out, unsigned char* out_q,
                                                  float* out_scale, const T* delta,
                                                  const W_T* __restrict__ weight, int dim,
                                                  float eps) {
    __shared__ float scratch[32];
    pdl_launch_dependents();  // the next GEMV may start prefetching its weight
    pdl_wait();               // ... and touches nothing before the previous kernel is done
    norm_block<true>(out, residual, delta, weight, dim, eps);
    const i64 row = blockIdx.x;
    quantize_row<true>(out_q + row * dim, out_scale + row, out + row * dim, dim, threadIdx.x,
                       blockDim.x, scratch);
}

extern "C" __global__ void add_rmsnorm_e4m3_warp(T* residual, T* out, unsigned char* out_q,
                                                 float* out_scale, const T* delta,
                                                 const W_T* __restrict__ weight, i64 rows,
                                                 int dim, float eps) {
    pdl_launch_dependents();
    pdl_wait();
    norm_warp<true>(out, residual, delta, weight, rows, dim, eps);
    const i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    quantize_row<false>(out_q + row * dim, out_scale + row, out + row * dim, dim,
                        threadIdx.x & 31, 32, nullptr);
}
#endif
