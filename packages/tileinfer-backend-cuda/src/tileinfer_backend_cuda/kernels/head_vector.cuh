// One warp's work on one head vector of HEAD_DIM elements, shared by kv.cu (store_kv,
// attention_inputs) and attention_decode.cu (its fused attention inputs), so that both compute
// the same bits: loading, the per-head RMSNorm + RoPE of queries and keys, and the store into
// the paged cache.
//
// Lane l holds elements [l * PER_LANE, (l + 1) * PER_LANE). Reductions (RMSNorm, the INT8
// absmax) are warp shuffles; RoPE's pairs (i, i + HEAD_DIM / 2) live in different lanes and meet
// in a per-warp float buffer of HEAD_DIM (shared memory).
//
// Cache layout (one layer): k_cache, v_cache (num_pages, page_size, kv_heads, HEAD_DIM); slot s
// is offset s % page_size of page s / page_size. INT8 cache (CACHE_INT8): int8 values with one
// float32 scale per cached vector in k_scale, v_scale (num_pages, page_size, kv_heads); keys are
// first divided by the per-channel smoothing factors k_smooth (kv_heads, HEAD_DIM) when given.
//
// Included after the defines HEAD_DIM and CACHE_INT8 and the typedefs T (activations), NORM_T
// (q/k norm weights) and CACHE_T (elements of a float cache).
#pragma once
#include "common.cuh"

constexpr int PER_LANE = (HEAD_DIM + 31) / 32;

#if CACHE_INT8
typedef signed char cache_elem_t;
#else
typedef CACHE_T cache_elem_t;
#endif

__device__ __forceinline__ bool lane_elem_valid(int lane, int e) {
    return lane * PER_LANE + e < HEAD_DIM;
}

// Whether a lane's PER_LANE elements of S can move in one aligned access.
template <typename S> constexpr bool lane_chunk_ok() {
    return HEAD_DIM % 32 == 0 && (PER_LANE * sizeof(S) == 2 || PER_LANE * sizeof(S) == 4 ||
                                  PER_LANE * sizeof(S) == 8 || PER_LANE * sizeof(S) == 16);
}

// Load the lane's PER_LANE elements of one head vector (zeros past HEAD_DIM).
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

// Per-head RMSNorm with `norm` (Qwen3, Apertus; skipped when null) with transformers' two
// roundings to T, then RoPE at position pos, rotate-half pairing:
// out[i] = x[i] c - x[i+half] s, out[i+half] = x[i+half] c + x[i] s. cos_table, sin_table:
// (max_len, HEAD_DIM / 2) float32; rotate: this warp's HEAD_DIM floats of shared memory.
//
// The arithmetic is spelled out (fmaf, __fmul_rn, ...) so that no build contracts it otherwise:
// kv.cu is compiled with multiply-add contraction and attention_decode.cu without (-fmad=false),
// and both must give the same bits (a verify step's rows equal its 1-token steps).
__device__ __forceinline__ void norm_rope(float (&x)[PER_LANE], int lane, const NORM_T* norm,
                                          float eps, float* rotate, const float* cos_table,
                                          const float* sin_table, i64 pos) {
    if (norm != nullptr) {
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) ss = fmaf(x[e], x[e], ss);
        ss = warp_sum(ss);
        const float inv_rms = rsqrtf(__fadd_rn(__fdiv_rn(ss, (float)HEAD_DIM), eps));
#pragma unroll
        for (int e = 0; e < PER_LANE; ++e) {
            if (!lane_elem_valid(lane, e)) continue;
            const float w8 = round_to<T>(to_float(norm[lane * PER_LANE + e]));
            x[e] = round_to<T>(__fmul_rn(w8, round_to<T>(__fmul_rn(x[e], inv_rms))));
        }
    }

    constexpr int HALF = HEAD_DIM / 2;
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e)
        if (lane_elem_valid(lane, e)) rotate[lane * PER_LANE + e] = x[e];
    __syncwarp();
#pragma unroll
    for (int e = 0; e < PER_LANE; ++e) {
        const int j = lane * PER_LANE + e;
        if (j >= HEAD_DIM) continue;
        const int i = j < HALF ? j : j - HALF;
        const float c = cos_table[pos * HALF + i], s = sin_table[pos * HALF + i];
        const float partner = rotate[j < HALF ? j + HALF : j - HALF];
        x[e] = j < HALF ? __fsub_rn(__fmul_rn(x[e], c), __fmul_rn(partner, s))
                        : __fadd_rn(__fmul_rn(x[e], c), __fmul_rn(partner, s));
    }
    __syncwarp();  // rotate may be reused
}
