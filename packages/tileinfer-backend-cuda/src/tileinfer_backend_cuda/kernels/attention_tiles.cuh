// What attention.cu and attention_decode.cu share, included after their defines (HEAD_DIM,
// KV_INT8, SMOOTH) and their THREADS: the swizzled bf16 tile layout, the query tile load, the
// int8 -> bf16 conversion of a copied page-row chunk, and the split-KV arrival and combine.
#pragma once
#include "common.cuh"

constexpr int CHUNKS = HEAD_DIM / 8;  // 16-byte chunks of bf16 per row
constexpr int Q_PARTS = SMOOTH ? 2 : 1;
constexpr int WS_ROW = HEAD_DIM + 2;  // a workspace row: a split's partial, its log-sum-exp, a counter

#if KV_INT8
typedef signed char kv_t;
#else
typedef bf16_t kv_t;
#endif

// 16-byte chunks of one key's (or value's) page row as stored: bf16 or int8.
constexpr int LOAD_CHUNKS = HEAD_DIM * (int)sizeof(kv_t) / 16;

// Shared-memory tiles are rows of HEAD_DIM bf16; chunk c of row r lives at chunk c ^ (r % 8) of
// the row, so the 8 rows an ldmatrix reads hit 8 different bank groups.
__device__ __forceinline__ int tile_chunk(int row, int chunk) {
    return row * CHUNKS + (chunk ^ (row & 7));
}

// Chunk c (8 bf16) of query tile row r into q_hi (swizzled); with SMOOTH the smoothed query as
// bf16 hi + lo parts (common.cuh), the smoothing factors of kv head kvh.
__device__ __forceinline__ void store_query_chunk(uint4* q_hi, uint4* q_lo, const uint4& v,
                                                  const float* k_smooth, int kvh, int r, int c) {
#if SMOOTH
    uint4 hi, lo;  // q * smooth = hi + lo (common.cuh)
    split_smoothed_query(v, k_smooth + kvh * HEAD_DIM + c * 8, hi, lo);
    q_hi[tile_chunk(r, c)] = hi;
    q_lo[tile_chunk(r, c)] = lo;
#else
    q_hi[tile_chunk(r, c)] = v;
#endif
}

// The query tile: packed rows m0 .. m0 + tile_rows of (sequence, kv head kvh), row rg being query
// token q_start + rg / group at head kvh * group + rg % group (rows past `rows` are zeros).
__device__ __forceinline__ void load_query_tile(uint4* q_hi, uint4* q_lo, const bf16_t* q,
                                                const float* k_smooth, int tile_rows, int m0,
                                                int rows, int q_start, int group, int kvh,
                                                int heads) {
    for (int id = threadIdx.x; id < tile_rows * CHUNKS; id += THREADS) {
        const int r = id / CHUNKS, c = id % CHUNKS, rg = m0 + r;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (rg < rows) {
            const int token = q_start + rg / group, head = kvh * group + rg % group;
            v = *reinterpret_cast<const uint4*>(q + ((i64)token * heads + head) * HEAD_DIM + c * 8);
        }
        store_query_chunk(q_hi, q_lo, v, k_smooth, kvh, r, c);
    }
}

// 16 int8 of a page row (one copied chunk) to the two 8-element bf16 chunks they make, exactly.
__device__ __forceinline__ void int8x16_to_bf16x16(const uint4& raw, uint4& lo, uint4& hi) {
    int8x4_to_bf16x2(raw.x, lo.x, lo.y);
    int8x4_to_bf16x2(raw.y, lo.z, lo.w);
    int8x4_to_bf16x2(raw.z, hi.x, hi.y);
    int8x4_to_bf16x2(raw.w, hi.z, hi.w);
}

// One query row's output from its splits' partials (flash-decoding's combine), by one warp:
// part holds `splits` workspace rows (normalized partial, log-sum-exp); a split with no key of
// the row (log-sum-exp -inf) adds nothing; out_row = sum_s 2^(lse_s - max) partial_s / sum_s
// 2^(lse_s - max), added in split order.
// This runs at the very end of the kernel, by the last block to arrive, so its memory latency
// is the kernel's tail: the splits' log-sum-exps are read at once (lane i: splits i, i + 32,
// ...) together with the first COMBINE_BATCH partials, and the partials of each later batch
// are all requested before any of them is added (a loop that loads, then adds, one split at a
// time waits an L2 round trip per split, so more splits had made the kernel slower:
// benchmarks/RESULTS.md, 2026-11-30, "the Triton INT8 GEMV's loads, the CUDA split-KV combine").
#ifndef COMBINE_BATCH
#define COMBINE_BATCH 8  // 8, 16 or 32 (a divisor of 32)
#endif
constexpr int COMBINE_HELD = 2;  // log-sum-exps a lane keeps from the first read: 64 splits

__device__ __forceinline__ void combine_split_row(bf16_t* out_row, const float* part, int splits,
                                                  int lane) {
    constexpr u32 ALL = 0xffffffffu;
    constexpr int E = HEAD_DIM / 32;  // lane holds dims lane + 32 e
    auto lse_of = [&](int sp) { return sp < splits ? __ldcg(part + sp * WS_ROW + HEAD_DIM) : neg_inf(); };
    float x[COMBINE_BATCH][E];  // the partials of splits first .. first + COMBINE_BATCH - 1
    auto load_batch = [&](int first) {
#pragma unroll
        for (int i = 0; i < COMBINE_BATCH; ++i)
#pragma unroll
            for (int e = 0; e < E; ++e)
                x[i][e] = first + i < splits ? __ldcg(part + (first + i) * WS_ROW + lane + 32 * e) : 0.0f;
    };
    load_batch(0);
    float held[COMBINE_HELD];  // lane's splits lane + 32 j (ops: at most 64 splits)
    float max_lse = neg_inf();
#pragma unroll
    for (int j = 0; j < COMBINE_HELD; ++j) {
        held[j] = lse_of(lane + 32 * j);
        max_lse = fmaxf(max_lse, held[j]);
    }
    for (int sp = lane + 32 * COMBINE_HELD; sp < splits; sp += 32) max_lse = fmaxf(max_lse, lse_of(sp));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) max_lse = fmaxf(max_lse, __shfl_xor_sync(ALL, max_lse, o));
    float acc[E], weight_sum = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    float my_weight = 0.0f;  // lane i: the weight of split 32 c + i of the current chunk c
    int my_keys = 0;         // ... and whether that split has any key of the row
    for (int first = 0; first < splits; first += COMBINE_BATCH) {
        if (first % 32 == 0) {
            const int chunk = first / 32;
            const float my_lse = chunk == 0 ? held[0] : chunk == 1 ? held[1] : lse_of(first + lane);
            my_keys = my_lse != neg_inf();
            my_weight = my_keys ? exp2f(my_lse - max_lse) : 0.0f;
        }
        if (first > 0) load_batch(first);
#pragma unroll
        for (int i = 0; i < COMBINE_BATCH; ++i) {  // in split order
            const float wgt = __shfl_sync(ALL, my_weight, (first + i) & 31);
            const int keys = __shfl_sync(ALL, my_keys, (first + i) & 31);
            if (first + i < splits && keys) {
                weight_sum += wgt;
#pragma unroll
                for (int e = 0; e < E; ++e) acc[e] += wgt * x[i][e];
            }
        }
    }
    const float inv = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) out_row[lane + 32 * e] = from_float<bf16_t>(acc[e] * inv);
}
