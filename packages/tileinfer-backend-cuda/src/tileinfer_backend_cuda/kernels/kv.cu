// Writing keys and values into the paged KV cache, and the fused attention inputs
// (per-head q/k RMSNorm + RoPE + store) that sit between the qkv projection and attention.
// One warp per head vector; what a warp does to a vector (layout, norm, RoPE, INT8 quantization)
// is head_vector.cuh's. Negative slots are skipped (padding tokens).
//
// Defines: DTYPE (activation type T of qkv / k / v), QOUT_DTYPE (queries' output type),
// NORM_DTYPE (q/k norm weight type), CACHE_DTYPE (element type of a float cache), CACHE_INT8
// (0/1), HEAD_DIM.
#include "common.cuh"

#ifndef DTYPE
#define DTYPE bf16_t
#endif
#ifndef QOUT_DTYPE
#define QOUT_DTYPE DTYPE
#endif
#ifndef NORM_DTYPE
#define NORM_DTYPE DTYPE
#endif
#ifndef CACHE_DTYPE
#define CACHE_DTYPE DTYPE
#endif
typedef DTYPE T;
typedef QOUT_DTYPE Q_OUT_T;
typedef NORM_DTYPE NORM_T;
typedef CACHE_DTYPE CACHE_T;
#ifndef CACHE_INT8
#define CACHE_INT8 0
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#include "head_vector.cuh"

constexpr int WARPS_PER_BLOCK = 4;

// store_kv: k, v (n, kv_heads, HEAD_DIM) with element strides (tok_stride, head_stride) (the
// same for k and v), slots (n,) int64. Warp w handles token w / (2 kv_heads), vector
// w % (2 kv_heads): keys first, then values.
extern "C" __global__ void __launch_bounds__(WARPS_PER_BLOCK * 32)
store_kv(cache_elem_t* __restrict__ k_cache, cache_elem_t* __restrict__ v_cache,
         float* __restrict__ k_scale, float* __restrict__ v_scale,
         const float* __restrict__ k_smooth, const T* __restrict__ k, const T* __restrict__ v,
         const i64* __restrict__ slots, int n, int kv_heads, int page_size, i64 tok_stride,
         i64 head_stride) {
    pdl_launch_dependents();  // PDL (common.cuh): the next kernel may start its launch now
    pdl_wait();               // ... and this one touches nothing before the previous one is done
    const i64 w = (i64)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= (i64)n * 2 * kv_heads) return;
    const int t = (int)(w / (2 * kv_heads));
    const int which = (int)(w % (2 * kv_heads));
    const bool is_key = which < kv_heads;
    const int head = is_key ? which : which - kv_heads;
    const i64 slot = slots[t];
    if (slot < 0) return;
    float x[PER_LANE];
    load_head<T>((is_key ? k : v) + t * tok_stride + head * head_stride, lane, x);
    store_vector(x, lane, slot, head, kv_heads, page_size, is_key ? k_cache : v_cache,
                 is_key ? k_scale : v_scale, is_key ? k_smooth : nullptr);
}

// attention_inputs: qkv (n, (heads + 2 kv_heads) * HEAD_DIM) holds the q, k and v heads of each
// token. Head slot h < heads is a query: RMSNorm with q_norm (if not null), RoPE at
// positions[t], written to q_out (n, heads, HEAD_DIM). heads <= h < heads + kv_heads is a key:
// RMSNorm with k_norm, RoPE, rounded to T, stored at slots[t]. The rest are values, stored.
// cos, sin: (max_len, HEAD_DIM / 2) float32. One warp per (token, head slot).
extern "C" __global__ void __launch_bounds__(WARPS_PER_BLOCK * 32)
attention_inputs(Q_OUT_T* __restrict__ q_out, cache_elem_t* __restrict__ k_cache,
                 cache_elem_t* __restrict__ v_cache, float* __restrict__ k_scale,
                 float* __restrict__ v_scale, const float* __restrict__ k_smooth,
                 const T* __restrict__ qkv, const NORM_T* __restrict__ q_norm,
                 const NORM_T* __restrict__ k_norm, const float* __restrict__ cos_table,
                 const float* __restrict__ sin_table, const int* __restrict__ positions,
                 const i64* __restrict__ slots, int n, int heads, int kv_heads, int page_size,
                 float eps) {
    __shared__ float rotate[WARPS_PER_BLOCK][HEAD_DIM];
    pdl_launch_dependents();
    pdl_wait();
    const int slots_per_token = heads + 2 * kv_heads;
    const i64 w = (i64)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (w >= (i64)n * slots_per_token) return;
    const int t = (int)(w / slots_per_token);
    const int h = (int)(w % slots_per_token);
    const bool is_query = h < heads, is_key = !is_query && h < heads + kv_heads;
    const i64 slot = slots[t];
    if (!is_query && slot < 0) return;

    float x[PER_LANE];
    load_head<T>(qkv + (i64)t * slots_per_token * HEAD_DIM + (i64)h * HEAD_DIM, lane, x);

    if (!is_query && !is_key) {  // a value vector: stored as is
        store_vector(x, lane, slot, h - heads - kv_heads, kv_heads, page_size, v_cache, v_scale,
                     nullptr);
        return;
    }

    // q/k norm and RoPE (head_vector.cuh)
    norm_rope(x, lane, is_query ? q_norm : k_norm, eps, rotate[warp], cos_table, sin_table,
              positions[t]);

    if (is_query) {
        store_head<Q_OUT_T>(q_out + ((i64)t * heads + h) * HEAD_DIM, lane, x);
        return;
    }
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) x[e] = round_to<T>(x[e]);  // k = rope(k).to(qkv.dtype)
    store_vector(x, lane, slot, h - heads, kv_heads, page_size, k_cache, k_scale, k_smooth);
}
