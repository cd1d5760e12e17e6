// Writing keys and values into the paged KV cache, and the fused attention inputs
// (per-head q/k RMSNorm + RoPE + store) that sit between the qkv projection and attention.
//
// Cache layout (one layer): k_cache, v_cache (num_pages, page_size, kv_heads, HEAD_DIM); slot s
// is offset s % page_size of page s / page_size. INT8 cache (CACHE_INT8): int8 values with one
// float32 scale per cached vector in k_scale, v_scale (num_pages, page_size, kv_heads); keys are
// first divided by the per-channel smoothing factors k_smooth (kv_heads, HEAD_DIM) when given.
// Negative slots are skipped (padding tokens).
//
// Work split: one warp per head vector of HEAD_DIM elements; lane l holds elements
// [l * PER_LANE, (l + 1) * PER_LANE). Reductions (RMSNorm, the INT8 absmax) are warp shuffles;
// RoPE's pairs (i, i + HEAD_DIM / 2) live in different lanes and meet in shared memory.
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

constexpr int PER_LANE = (HEAD_DIM + 31) / 32;
constexpr int WARPS_PER_BLOCK = 4;

#if CACHE_INT8
typedef signed char cache_elem_t;
#else
typedef CACHE_T cache_elem_t;
#endif

__device__ __forceinline__ bool lane_elem_valid(int lane, int e) {
    return lane * PER_LANE + e < HEAD_DIM;
}

// Load the lane's PER_LANE elements of one head vector (zeros past HEAD_DIM).
// Whether a lane's PER_LANE elements of S can move in one aligned access.
template <typename S> constexpr bool lane_chunk_ok() {
    return HEAD_DIM % 32 == 0 && (PER_LANE * sizeof(S) == 2 || PER_LANE * sizeof(S) == 4 ||
                                  PER_LANE * sizeof(S) == 8 || PER_LANE * sizeof(S) == 16);
}

template <typename S>
__device__ __forceinline__ void load_head(const S* src, int lane, float (&v)[PER_LANE]) {
    if constexpr (lane_chunk_ok<S>()) {
        load_chunk<S, PER_LANE>(src + lane * PER_LANE, v);
    } else {
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e)
            v[e] = lane_elem_valid(lane, e) ? to_float(src[lane * PER_LANE + e]) : 0.0f;
    }
}

template <typename S>
__device__ __forceinline__ void store_head(S* dst, int lane, const float (&v)[PER_LANE]) {
    if constexpr (lane_chunk_ok<S>()) {
        store_chunk<S, PER_LANE>(dst + lane * PER_LANE, v);
    } else {
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e)
            if (lane_elem_valid(lane, e)) dst[lane * PER_LANE + e] = from_float<S>(v[e]);
    }
}

// Store one key or value vector (already in float32, after any norm/RoPE rounding) at `slot`.
// Keys are divided by k_smooth when given; the INT8 cache quantizes per vector:
// scale = max|v| / 127 (1 for a zero vector), q = round_half_even(v / scale) in [-127, 127].
__device__ __forceinline__ void store_vector(float (&v)[PER_LANE], int lane, i64 slot,
                                             int kv_head, int kv_heads, int page_size,
                                             cache_elem_t* cache, float* scale_pool,
                                             const float* smooth) {
    const i64 page = slot / page_size, offset = slot - page * page_size;
    const i64 vec_index = (page * page_size + offset) * kv_heads + kv_head;
    if (smooth != nullptr) {
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e)
            if (lane_elem_valid(lane, e)) v[e] = v[e] / smooth[kv_head * HEAD_DIM + lane * PER_LANE + e];
    }
    cache_elem_t* dst = cache + vec_index * HEAD_DIM;
#if CACHE_INT8
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) amax = fmaxf(amax, fabsf(v[e]));
    amax = warp_max(amax);
    const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
        if (!lane_elem_valid(lane, e)) continue;
        const float q = fminf(fmaxf(rintf(v[e] / scale), -127.0f), 127.0f);
        dst[lane * PER_LANE + e] = (signed char)(int)q;
    }
    if (lane == 0) scale_pool[vec_index] = scale;
#else
    store_head<CACHE_T>(dst, lane, v);
#endif
}

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

    // Per-head RMSNorm (Qwen3, Apertus) with transformers' two roundings to T.
    const NORM_T* norm = is_query ? q_norm : k_norm;
    if (norm != nullptr) {
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) ss += x[e] * x[e];
        ss = warp_sum(ss);
        const float inv_rms = rsqrtf(ss / (float)HEAD_DIM + eps);
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) {
            if (!lane_elem_valid(lane, e)) continue;
            const float w8 = round_to<T>(to_float(norm[lane * PER_LANE + e]));
            x[e] = round_to<T>(w8 * round_to<T>(x[e] * inv_rms));
        }
    }

    // RoPE, rotate-half pairing: out[i] = x[i] c - x[i+half] s, out[i+half] = x[i+half] c + x[i] s.
    constexpr int HALF = HEAD_DIM / 2;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e)
        if (lane_elem_valid(lane, e)) rotate[warp][lane * PER_LANE + e] = x[e];
    __syncwarp();
    const i64 pos = positions[t];
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
        const int j = lane * PER_LANE + e;
        if (j >= HEAD_DIM) continue;
        const int i = j < HALF ? j : j - HALF;
        const float c = cos_table[pos * HALF + i], s = sin_table[pos * HALF + i];
        const float partner = rotate[warp][j < HALF ? j + HALF : j - HALF];
        x[e] = j < HALF ? x[e] * c - partner * s : x[e] * c + partner * s;
    }

    if (is_query) {
        store_head<Q_OUT_T>(q_out + ((i64)t * heads + h) * HEAD_DIM, lane, x);
        return;
    }
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) x[e] = round_to<T>(x[e]);  // k = rope(k).to(qkv.dtype)
    store_vector(x, lane, slot, h - heads, kv_heads, page_size, k_cache, k_scale, k_smooth);
}
