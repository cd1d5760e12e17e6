// Paged grouped-query attention for a step of one or more sequences (prefill, decode, speculative
// verification, DFlash blocks), bf16 or INT8 pages, causal or not.
// ops.attention runs steps of at most 16 query tokens per sequence (decode, verify) with
// attention_decode.cu instead: with few packed rows (4 per kv head for llama3-8b), only warp 0
// of a block here would compute; there the four warps split each key tile.
//
// Technique: FlashAttention-2 (Dao, arXiv:2307.08691) tiles over a paged KV cache (vLLM,
// arXiv:2309.06180), with GQA packing and flash-decoding's split-KV (Dao et al., "Flash-Decoding
// for long-context inference", 2023):
//   * A block owns one sequence b, one kv head and a tile of BM = 64 "packed" query rows: the
//     rows (i, h) of query position i and query head h of the kv head's group, packed as
//     r = i * group + h. At decode (one position) the whole group (e.g. 8 heads) shares every
//     K/V tile the block loads, so K and V are read once per kv head, not once per query head.
//   * Keys are gathered page by page (block_table) into shared memory BN = 64 at a time;
//     S = Q K^T and O += P V run on the tensor cores (mma.m16n8k16, bf16 in, float32 out),
//     with the online softmax in float32 (exp2 with log2(e) folded into the scale).
//   * Split-KV: when a step has few query rows (decode), each (sequence, kv head, row tile) is
//     split into num_splits blocks over the context, so that a short step still fills the GPU.
//     Each writes its normalized partial output and log-sum-exp to the workspace; the last
//     block of the tile to finish (an atomic counter, reset afterwards) combines them in split
//     order: out = sum_s exp(lse_s - max) o_s / sum_s exp(lse_s - max). Deterministic, one launch.
//   * Pipelining: K/V tiles stream through a ring of KV_STAGES shared-memory stages with cp.async
//     (16-byte copies, no registers held): while the warps compute on tile i, the copies of
//     tiles i + 1 .. i + KV_STAGES - 1 are in flight, so a block keeps the memory system busy
//     instead of alternating between loading and computing.
// INT8 pages hold int8 values (exact in bf16) and one float32 scale per vector: key scales
// multiply the scores, value scales the probabilities before P V. The int8 bytes (half the
// bytes of bf16) and the scales are copied asynchronously into raw stages like bf16 tiles; once a
// stage has landed, one pass converts it to the bf16 tiles the tensor cores read. Smoothed keys
// (key = k_smooth * scale * int8) fold k_smooth into the queries, split into a bf16 high and low
// part (two mma passes) so that the product keeps float32 accuracy.
//
// Shapes: q, out (tokens, heads, HEAD_DIM) bf16; k_cache, v_cache (pages, page_size, kv_heads,
// HEAD_DIM) bf16 or int8; k_scale, v_scale (pages, page_size, kv_heads) float32; k_smooth
// (kv_heads, HEAD_DIM) float32; cu_seqlens_q (batch + 1,), context_lens (batch,), block_table
// (batch, max_pages) int32. Query row i of sequence b is at position context_lens[b] - q_len + i.
// Grid: (row_tiles * num_splits, kv_heads, batch); block: 128 threads (4 warps x 16 rows).
// Workspace (split-KV): float32 (tokens_cap, heads, ws_splits, HEAD_DIM + 2): partial outputs,
// the lse in column HEAD_DIM and, viewed as int32, the tile counters in column HEAD_DIM + 1.
//
// Dynamic shared memory: sizeof(SharedTiles) below (ops/attention.py's attention_smem_bytes).
//
// Defines: HEAD_DIM (a multiple of 64, at most 256), KV_INT8 (0/1), SMOOTH (0/1), KV_STAGES
// (ring depth; 1 = load, then compute, for GPUs with less shared memory).
#include "common.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef KV_INT8
#define KV_INT8 0
#endif
#ifndef SMOOTH
#define SMOOTH 0
#endif
#ifndef KV_STAGES
#define KV_STAGES 2
#endif

constexpr int BM = 64, BN = 64, WARPS = 4, THREADS = WARPS * 32;
static_assert(KV_STAGES >= 1, "at least one K/V stage");

#include "attention_tiles.cuh"  // CHUNKS, WS_ROW, kv_t, LOAD_CHUNKS, tile_chunk, ...

constexpr int LOADS_PER_THREAD = BN * LOAD_CHUNKS / THREADS;  // exact: HEAD_DIM % 64 == 0
static_assert(THREADS % LOAD_CHUNKS == 0 && LOADS_PER_THREAD * THREADS == BN * LOAD_CHUNKS, "tiling");

struct SharedTiles {
    uint4 q[Q_PARTS][BM * CHUNKS];
#if KV_INT8
    uint4 k[BN * CHUNKS];                          // bf16 tiles the mma reads (swizzled)
    uint4 v[BN * CHUNKS];
    uint4 k_raw[KV_STAGES][BN * LOAD_CHUNKS];      // int8 rows as copied, key-major, unswizzled
    uint4 v_raw[KV_STAGES][BN * LOAD_CHUNKS];
    float k_scale[KV_STAGES][BN];
    float v_scale[KV_STAGES][BN];
#else
    uint4 k[KV_STAGES][BN * CHUNKS];               // bf16 tiles, copied in place (swizzled)
    uint4 v[KV_STAGES][BN * CHUNKS];
#endif
};

extern "C" __global__ void __launch_bounds__(THREADS)
attention(bf16_t* __restrict__ out, const bf16_t* __restrict__ q, const kv_t* __restrict__ k_cache,
          const kv_t* __restrict__ v_cache, const float* __restrict__ k_scale,
          const float* __restrict__ v_scale, const float* __restrict__ k_smooth,
          const int* __restrict__ cu_seqlens_q, const int* __restrict__ context_lens,
          const int* __restrict__ block_table, int heads, int kv_heads, int page_size,
          int max_pages, float scale_log2, int causal, int num_splits, float* ws, int ws_splits) {
    extern __shared__ uint4 smem_raw[];
    SharedTiles& sm = *reinterpret_cast<SharedTiles*>(smem_raw);

    pdl_launch_dependents();  // the o projection's GEMV may start prefetching its weight
    pdl_wait();               // with PDL (common.cuh): the previous kernel is done from here on
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int split = blockIdx.x % num_splits, row_tile = blockIdx.x / num_splits;
    const int kvh = blockIdx.y, b = blockIdx.z;
    const int group = heads / kv_heads;
    const int q_start = cu_seqlens_q[b];
    const int q_len = cu_seqlens_q[b + 1] - q_start;
    const int ctx = context_lens[b];
    const int rows = q_len * group;          // packed query rows of (b, kvh)
    const int m0 = row_tile * BM;
    if (m0 >= rows) return;                  // the same for every split: no counter to bump

    // Keys this row tile may see, and this split's share (a whole number of BN tiles).
    const int last_row = min(rows, m0 + BM) - 1;
    const int kv_end = causal ? min(ctx, ctx - q_len + last_row / group + 1) : ctx;
    int chunk = (kv_end + num_splits - 1) / num_splits;
    chunk = (chunk + BN - 1) / BN * BN;
    const int kv_begin = min(kv_end, split * chunk);
    const int kv_stop = min(kv_end, kv_begin + chunk);

    // --- the query tile (rows past `rows` are zeros) ---
    load_query_tile(sm.q[0], sm.q[Q_PARTS - 1], q, k_smooth, BM, m0, rows, q_start, group, kvh, heads);

    // Per thread: rows g and g + 8 of the warp's 16; running max / sum in the log2 domain.
    float row_max[2] = {neg_inf(), neg_inf()};
    float row_sum[2] = {0.0f, 0.0f};  // this thread's columns only; reduced over the quad at the end
    float o_acc[HEAD_DIM / 8][4];
#pragma unroll
    for (int d = 0; d < HEAD_DIM / 8; ++d) o_acc[d][0] = o_acc[d][1] = o_acc[d][2] = o_acc[d][3] = 0.0f;
    const bool warp_active = m0 + warp * 16 < rows;
    int row_pos[2];  // position of each of the thread's two rows
#pragma unroll
    for (int h = 0; h < 2; ++h) row_pos[h] = ctx - q_len + (m0 + warp * 16 + g + 8 * h) / group;

    const i64 kv_row_stride = (i64)kv_heads * HEAD_DIM;  // elements between consecutive slots
    const int* pages = block_table + (i64)b * max_pages;
    // Chunk (key, c) of a tile: this thread always copies chunk c = tid % LOAD_CHUNKS of keys
    // tid / LOAD_CHUNKS + j * (THREADS / LOAD_CHUNKS), j < LOADS_PER_THREAD.
    const int load_c = tid % LOAD_CHUNKS, load_key0 = tid / LOAD_CHUNKS;

    // Start the copies of tile `tile` (keys kv_begin + tile * BN ...) into ring stage `stage`,
    // zeros past kv_stop, as one commit group. Every call commits a group (possibly empty), so
    // "tile i has landed" is a fixed count of outstanding groups.
    auto issue = [&](int tile, int stage) {
        const int kv0 = kv_begin + tile * BN;
        if (kv0 < kv_stop) {
            int slot[LOADS_PER_THREAD];
#pragma unroll
            for (int j = 0; j < LOADS_PER_THREAD; ++j) {  // page lookups first, all in flight
                const int pos = kv0 + load_key0 + j * (THREADS / LOAD_CHUNKS);
                slot[j] = pos < kv_stop ? pages[pos / page_size] * page_size + pos % page_size : -1;
            }
#pragma unroll
            for (int j = 0; j < LOADS_PER_THREAD; ++j) {
                const int key = load_key0 + j * (THREADS / LOAD_CHUNKS);
                const bool valid = slot[j] >= 0;
                const i64 offset = (valid ? (i64)slot[j] * kv_row_stride : 0) +
                                   (i64)kvh * HEAD_DIM + load_c * (16 / (int)sizeof(kv_t));
#if KV_INT8
                const int cell = key * LOAD_CHUNKS + load_c;
                cp_async_cg16(smem_addr(&sm.k_raw[stage][cell]), k_cache + offset, valid ? 16 : 0);
                cp_async_cg16(smem_addr(&sm.v_raw[stage][cell]), v_cache + offset, valid ? 16 : 0);
#else
                const int cell = tile_chunk(key, load_c);
                cp_async_cg16(smem_addr(&sm.k[stage][cell]), k_cache + offset, valid ? 16 : 0);
                cp_async_cg16(smem_addr(&sm.v[stage][cell]), v_cache + offset, valid ? 16 : 0);
#endif
            }
#if KV_INT8
            if (tid < BN) {  // one scale per key for K and for V
                const int pos = kv0 + tid;
                const bool valid = pos < kv_stop;
                const i64 slot = valid ? (i64)pages[pos / page_size] * page_size + pos % page_size : 0;
                const i64 idx = slot * kv_heads + kvh;
                cp_async_ca4(smem_addr(&sm.k_scale[stage][tid]), k_scale + idx, valid ? 4 : 0);
                cp_async_ca4(smem_addr(&sm.v_scale[stage][tid]), v_scale + idx, valid ? 4 : 0);
            }
#endif
        }
        cp_async_commit();
    };

    const int n_tiles = (kv_stop - kv_begin + BN - 1) / BN;  // kv_stop >= kv_begin
#pragma unroll
    for (int i = 0; i < KV_STAGES - 1; ++i) issue(i, i);
    for (int it = 0; it < n_tiles; ++it) {
        const int kv0 = kv_begin + it * BN, stage = it % KV_STAGES;
#if KV_STAGES == 1
        __syncthreads();  // every warp is done with tile it - 1 (and the query tile is written)
        issue(it, 0);
        cp_async_wait<0>();
        __syncthreads();
#else
        cp_async_wait<KV_STAGES - 2>();  // this thread's copies of tile `it` have landed
        // Every thread's copies of tile `it` have landed, and every warp is done with tile
        // it - 1 (the query tile too, on the first pass), whose stage is refilled next.
        __syncthreads();
        issue(it + KV_STAGES - 1, (it + KV_STAGES - 1) % KV_STAGES);
#endif
#if KV_INT8
        // int8 -> bf16 (exact), 16 int8 of a row = two 8-element bf16 chunks of the swizzled tile.
#pragma unroll
        for (int j = 0; j < LOADS_PER_THREAD; ++j) {
            const int key = load_key0 + j * (THREADS / LOAD_CHUNKS);
            const uint4 rk = sm.k_raw[stage][key * LOAD_CHUNKS + load_c];
            const uint4 rv = sm.v_raw[stage][key * LOAD_CHUNKS + load_c];
            uint4 k0, k1, v0, v1;
            int8x16_to_bf16x16(rk, k0, k1);
            int8x16_to_bf16x16(rv, v0, v1);
            sm.k[tile_chunk(key, 2 * load_c)] = k0;
            sm.k[tile_chunk(key, 2 * load_c + 1)] = k1;
            sm.v[tile_chunk(key, 2 * load_c)] = v0;
            sm.v[tile_chunk(key, 2 * load_c + 1)] = v1;
        }
        __syncthreads();
        const uint4* k_tile = sm.k;
        const uint4* v_tile = sm.v;
        const float* ks_tile = sm.k_scale[stage];
        const float* vs_tile = sm.v_scale[stage];
#else
        const uint4* k_tile = sm.k[stage];
        const uint4* v_tile = sm.v[stage];
#endif
        if (!warp_active) continue;

        // --- S = Q K^T for the warp's 16 rows x BN keys (8 n-tiles of 8 keys) ---
        float s[BN / 8][4];
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
            u32 kf[BN / 8][2];
#pragma unroll
            for (int np = 0; np < BN / 16; ++np) {
                const int key = np * 16 + (lane & 7) + ((lane >> 4) << 3);
                const int c = kk * 2 + ((lane >> 3) & 1);
                ldmatrix_x4(kf[2 * np][0], kf[2 * np][1], kf[2 * np + 1][0], kf[2 * np + 1][1],
                            smem_addr(&k_tile[tile_chunk(key, c)]));
            }
#pragma unroll
            for (int part = 0; part < Q_PARTS; ++part) {
                u32 a0, a1, a2, a3;
                const int r = warp * 16 + (lane & 15), c = kk * 2 + (lane >> 4);
                ldmatrix_x4(a0, a1, a2, a3, smem_addr(&sm.q[part][tile_chunk(r, c)]));
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) mma_bf16_16816(s[j], a0, a1, a2, a3, kf[j][0], kf[j][1]);
            }
        }

        // --- scale, mask, online softmax ---
        float tile_max[2] = {neg_inf(), neg_inf()};
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key_local = j * 8 + 2 * t + (e & 1), pos = kv0 + key_local, h = e >> 1;
                float v = s[j][e] * scale_log2;
#if KV_INT8
                v *= ks_tile[key_local];
#endif
                if (pos >= kv_stop || (causal && pos > row_pos[h])) v = neg_inf();
                s[j][e] = v;
                tile_max[h] = fmaxf(tile_max[h], v);
            }
        float alpha[2], base[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
            tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
            const float new_max = fmaxf(row_max[h], tile_max[h]);
            base[h] = new_max == neg_inf() ? 0.0f : new_max;  // a fully masked row stays at zero
            alpha[h] = exp2f(row_max[h] - base[h]);
            row_max[h] = new_max;
            row_sum[h] *= alpha[h];
        }
#pragma unroll
        for (int d = 0; d < HEAD_DIM / 8; ++d) {
            o_acc[d][0] *= alpha[0];
            o_acc[d][1] *= alpha[0];
            o_acc[d][2] *= alpha[1];
            o_acc[d][3] *= alpha[1];
        }
        u32 p_frag[BN / 8][2];  // P as bf16 pairs: [j][0] row g, [j][1] row g + 8
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                p[e] = exp2f(s[j][e] - base[e >> 1]);
                row_sum[e >> 1] += p[e];
#if KV_INT8
                p[e] *= vs_tile[j * 8 + 2 * t + (e & 1)];
#endif
            }
            p_frag[j][0] = pack_bf16x2(p[0], p[1]);
            p_frag[j][1] = pack_bf16x2(p[2], p[3]);
        }

        // --- O += P V: k = the tile's keys (4 steps of 16), n = HEAD_DIM ---
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
            const u32 a0 = p_frag[2 * kk][0], a1 = p_frag[2 * kk][1];
            const u32 a2 = p_frag[2 * kk + 1][0], a3 = p_frag[2 * kk + 1][1];
#pragma unroll
            for (int dp = 0; dp < HEAD_DIM / 16; ++dp) {
                u32 b0, b1, b2, b3;
                const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
                const int c = dp * 2 + (lane >> 4);
                ldmatrix_x4_trans(b0, b1, b2, b3, smem_addr(&v_tile[tile_chunk(key, c)]));
                mma_bf16_16816(o_acc[2 * dp], a0, a1, a2, a3, b0, b1);
                mma_bf16_16816(o_acc[2 * dp + 1], a0, a1, a2, a3, b2, b3);
            }
        }
    }

    cp_async_wait<0>();  // no copy may still target shared memory when the block exits

    // --- finish: normalize, write the output or this split's partial ---
    float inv_sum[2], lse[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float l = row_sum[h];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv_sum[h] = l > 0.0f ? 1.0f / l : 0.0f;
        lse[h] = l > 0.0f ? row_max[h] + log2f(l) : neg_inf();
    }
    const bool split_mode = num_splits > 1;
    if (warp_active) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int rg = m0 + warp * 16 + g + 8 * h;
            if (rg >= rows) continue;
            const i64 token = q_start + rg / group, head = kvh * group + rg % group;
            if (!split_mode) {
                bf16_t* dst = out + (token * heads + head) * HEAD_DIM;
#pragma unroll
                for (int d = 0; d < HEAD_DIM / 8; ++d)
                    *reinterpret_cast<u32*>(dst + d * 8 + 2 * t) =
                        pack_bf16x2(o_acc[d][2 * h] * inv_sum[h], o_acc[d][2 * h + 1] * inv_sum[h]);
            } else {
                float* dst = ws + ((token * heads + head) * ws_splits + split) * WS_ROW;
#pragma unroll
                for (int d = 0; d < HEAD_DIM / 8; ++d)
                    *reinterpret_cast<float2*>(dst + d * 8 + 2 * t) =
                        make_float2(o_acc[d][2 * h] * inv_sum[h], o_acc[d][2 * h + 1] * inv_sum[h]);
                if (t == 0) dst[HEAD_DIM] = lse[h];
            }
        }
    }
    if (!split_mode) return;

    // --- split-KV: the last block of this row tile combines the splits ---
    const int row_tiles = gridDim.x / num_splits;
    int* counter = reinterpret_cast<int*>(ws) +
                   ((i64)(b * kv_heads + kvh) * row_tiles + row_tile) * WS_ROW + HEAD_DIM + 1;
    if (!last_split_to_arrive(counter, num_splits)) return;
    for (int r = warp; r < BM; r += WARPS) {  // a warp per row, lanes over head_dim
        const int rg = m0 + r;
        if (rg >= rows) break;
        const i64 token = q_start + rg / group, head = kvh * group + rg % group;
        combine_split_row(out + (token * heads + head) * HEAD_DIM,
                          ws + (token * heads + head) * ws_splits * WS_ROW, num_splits, lane);
    }
    if (tid == 0) *counter = 0;  // ready for the next launch (and the next graph replay)
}
