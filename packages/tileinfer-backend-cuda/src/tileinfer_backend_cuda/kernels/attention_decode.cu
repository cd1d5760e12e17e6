// Paged grouped-query attention for decode and speculative verify steps (at most
// ATTN_DECODE_MAX_TOKENS = 16 query tokens per sequence: a DFlash block of 16 included), bf16
// or INT8 pages, causal or not. A block owns one sequence b, one kv head, one split of the
// context and a row tile of up to BM = 16 * M_TILES packed query rows r = i * group + h (query
// position i, head h of the kv head's group); warp w takes keys [16w, 16w + 16) of every 64-key
// tile, with its own online softmax state, and the warps' states are merged in the fixed order
// 0..3. Split s of a row that sees c keys takes keys [s * C, min(c, (s + 1) * C)), C = 64 *
// max(MIN_SPLIT_TILES, ceil(c / (64 * num_splits))), or C = SPLIT_KEYS (batch-invariant steps).
// The design (why a second kernel, the partition and why a verify row gets a decode row's bits,
// INT8 pages on int8 tensor cores, PDL, the fused inputs): docs/cuda-kernels.md,
// "attention_decode.cu in detail".
//
// Shapes, arguments, grid and workspace as in attention.cu, with BM rows per row tile: grid
// (row_tiles * grid_splits, kv_heads, batch), block 128 threads (4 warps), grid_splits =
// min(num_splits, ceil(max_context_len / (64 * MIN_SPLIT_TILES))). Dynamic shared memory:
// sizeof(SharedTiles) (attention_decode_smem.cuh; ops/attention.py mirrors it). Compiled with
// -fmad=false (ops): every unrolled copy of the per-row arithmetic (one per m-tile) rounds the
// same way.

#include "common.cuh"
#include "attention_decode_defines.cuh"  // the defines' defaults, BN, WARPS, KEYS, BM, ...

#include "attention_tiles.cuh"  // CHUNKS, WS_ROW, kv_t, LOAD_CHUNKS, tile_chunk, ...
// head_vector.cuh's parameters: the fused inputs read bf16 activations into a bf16 or INT8 cache.
#define CACHE_INT8 KV_INT8
typedef bf16_t T;
typedef bf16_t CACHE_T;
typedef NORM_DTYPE NORM_T;
#include "head_vector.cuh"  // load_head, norm_rope, store_vector

#include "attention_decode_smem.cuh"  // KEY_STEP, LOADS, WarpSlice, SharedTiles, ...
#include "attention_decode_mma.cuh"   // scores_int8, scores_bf16, pv_bf16
#include "attention_decode_merge.cuh" // store_warp_state, merge_warp_states

extern "C" __global__ void __launch_bounds__(THREADS)
attention_decode(bf16_t* __restrict__ out, const bf16_t* __restrict__ q,
                 kv_t* __restrict__ k_cache, kv_t* __restrict__ v_cache,
                 float* __restrict__ k_scale, float* __restrict__ v_scale,
                 const float* __restrict__ k_smooth, const int* __restrict__ cu_seqlens_q,
                 const int* __restrict__ context_lens, const int* __restrict__ block_table,
                 int heads, int kv_heads, int page_size, int max_pages, float scale_log2,
                 int causal, int num_splits, int grid_splits, float* ws, int ws_splits,
                 // FUSED_INPUTS only (attention_inputs' arguments; q is unused then):
                 const bf16_t* __restrict__ qkv, const NORM_T* __restrict__ q_norm,
                 const NORM_T* __restrict__ k_norm, const float* __restrict__ cos_table,
                 const float* __restrict__ sin_table, const int* __restrict__ positions,
                 const i64* __restrict__ slots, float eps) {
    extern __shared__ uint4 smem_raw[];
    SharedTiles& sm = *reinterpret_cast<SharedTiles*>(smem_raw);

#if PDL_TRIGGER == 0
    pdl_launch_dependents();  // the o projection's GEMV may start prefetching its weight
#endif
    // Up to pdl_wait only the step's metadata (cu_seqlens_q, context_lens, block_table) is read:
    // it is uploaded before the step's first kernel, which is launched without PDL, and no kernel
    // writes it, so it is complete even while the previous kernels still run.
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    // num_splits defines the partition; the grid has blocks for the first grid_splits splits only
    // (the host's bound on the splits any row of the cache can have keys in, see the header).
    const int split = blockIdx.x % grid_splits, row_tile = blockIdx.x / grid_splits;
    const int kvh = blockIdx.y, b = blockIdx.z;
    const int group = heads / kv_heads;
    const int q_start = cu_seqlens_q[b];
    const int q_len = cu_seqlens_q[b + 1] - q_start;
    const int ctx = context_lens[b];
    const int rows = q_len * group;  // packed query rows of (b, kvh)
    const int m0 = row_tile * BM;
    if (m0 >= rows) return;  // the same for every split: no counter to bump
    const int m_tiles = min(M_TILES, (rows - m0 + 15) / 16);

    // Keys row rg sees, and the keys per split of a row that sees c keys (see the header).
    auto row_keys = [&](int rg) { return causal ? ctx - q_len + rg / group + 1 : ctx; };
    auto split_keys = [&](int c) {
#if SPLIT_KEYS
        return SPLIT_KEYS + 0 * c;  // batch-invariant steps: a fixed size, from position 0
#else
        return BN * max(MIN_SPLIT_TILES, (c + BN * num_splits - 1) / (BN * num_splits));
#endif
    };
    const int c_first = row_keys(m0), c_last = row_keys(min(rows, m0 + BM) - 1);
    const int chunk_first = split_keys(c_first), chunk_last = split_keys(c_last);
    // Splits with keys for some row of the tile: 0 .. active_splits - 1 (at least split 0, which
    // writes the zeros of rows that see no key).
    const int active_splits = max(1, min(num_splits, (c_last + chunk_first - 1) / chunk_first));
    if (split >= active_splits) return;  // not counted by the combine either
    // This block's keys: [a0, a1) for the rows of chunk_first, then [b0, b1) for those of chunk_last.
    const int a0 = split * chunk_first, a1 = min(c_last, a0 + chunk_first);
    const int b0 = max(a1, split * chunk_last);
    const int b1 = chunk_last == chunk_first ? b0 : max(b0, min(c_last, (split + 1) * chunk_last));
    const int tiles_a = (max(0, a1 - a0) + BN - 1) / BN;
    const int n_tiles = tiles_a + (b1 - b0 + BN - 1) / BN;
    auto tile_start = [&](int tile) { return tile < tiles_a ? a0 + tile * BN : b0 + (tile - tiles_a) * BN; };
    auto tile_end = [&](int tile) { return tile < tiles_a ? a1 : b1; };

    // Per thread: rows g and g + 8 of each m-tile; the keys [lo, hi) each may see in this split.
    int row_lo[M_TILES][2], row_hi[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int rg = m0 + mt * 16 + g + 8 * h;
            const int c = rg < rows ? row_keys(rg) : 0, chunk = split_keys(c);
            row_lo[mt][h] = split * chunk;
            row_hi[mt][h] = min(c, row_lo[mt][h] + chunk);
        }

    const i64 kv_row_stride = (i64)kv_heads * HEAD_DIM;  // elements between consecutive slots
    const int* pages = block_table + (i64)b * max_pages;
    // Lane `lane` looks up the page (and the INT8 scale) of key lane % 16 of the warp's slice and
    // copies chunk load_c of keys load_key0 + j * KEY_STEP, j < LOADS.
    const int my_key = lane & (KEYS - 1);
    const int load_c = lane % LOAD_CHUNKS, load_key0 = lane / LOAD_CHUNKS;

    // Block-table entry of key my_key of the warp's slice of tile `tile`; -1 past the keys.
    auto page_of = [&](int tile) {
        if (tile >= n_tiles) return -1;
        const int pos = tile_start(tile) + warp * KEYS + my_key;
        return pos < tile_end(tile) ? pages[pos / page_size] : -1;
    };

    // Start the copies of the warp's slice of tile `tile` into ring stage `stage` (zeros past the
    // keys), as one commit group; page = page_of(tile). Every call commits a group (possibly
    // empty), so "tile i has landed" is a fixed count of outstanding groups.
    auto issue = [&](int tile, int stage, int page) {
        if (tile < n_tiles) {
            WarpSlice& dst = sm.ring.stage[stage][warp];
            const int pos = tile_start(tile) + warp * KEYS + my_key;
            const int slot = page >= 0 ? page * page_size + pos % page_size : -1;
#pragma unroll
            for (int j = 0; j < LOADS; ++j) {
                const int key = load_key0 + j * KEY_STEP;
                const int key_slot = __shfl_sync(FULL, slot, key);
                const bool valid = key_slot >= 0;
                const i64 offset = (valid ? (i64)key_slot * kv_row_stride : 0) + (i64)kvh * HEAD_DIM +
                                   load_c * (16 / (int)sizeof(kv_t));
#if KV_INT8
                const int cell = raw_chunk(key, load_c);
                cp_async_cg16(smem_addr(&dst.k_raw[cell]), k_cache + offset, valid ? 16 : 0);
                cp_async_cg16(smem_addr(&dst.v_raw[cell]), v_cache + offset, valid ? 16 : 0);
#else
                const int cell = tile_chunk(key, load_c);
                cp_async_cg16(smem_addr(&dst.k[cell]), k_cache + offset, valid ? 16 : 0);
                cp_async_cg16(smem_addr(&dst.v[cell]), v_cache + offset, valid ? 16 : 0);
#endif
            }
#if KV_INT8
            // lanes 0-15: the key scales of the slice's 16 keys, lanes 16-31: the value scales
            const i64 idx = (slot >= 0 ? (i64)slot : 0) * kv_heads + kvh;
            float* scale_dst = lane < KEYS ? &dst.k_scale[my_key] : &dst.v_scale[my_key];
            cp_async_ca4(smem_addr(scale_dst), (lane < KEYS ? k_scale : v_scale) + idx, slot >= 0 ? 4 : 0);
#endif
        }
        cp_async_commit();
    };

    int page = page_of(0);  // metadata: before pdl_wait (see above)
    pdl_wait();             // with PDL (common.cuh): q and the cache are written from here on
#if FUSED_INPUTS
    // One query token per sequence (ops): rows r < group are heads kvh * group + r of token
    // q_start, at position ctx - 1. Scratch: this warp's HEAD_DIM floats (RoPE) and HEAD_DIM bf16
    // (a finished query row) in its slice of the last ring stage.
    const int slots_per_token = heads + 2 * kv_heads;
    const bf16_t* token_qkv = qkv + (i64)q_start * slots_per_token * HEAD_DIM;
    float* rotate = reinterpret_cast<float*>(&sm.ring.stage[KV_STAGES - 1][warp]);
    bf16_t* q_row = reinterpret_cast<bf16_t*>(rotate + HEAD_DIM);
    if (split == active_splits - 1) {  // the split holding the new key: store it before any copy
        const i64 slot = slots[q_start];
        if (slot >= 0 && warp < 2) {
            float x[PER_LANE];
            if (warp == 0) {  // the key: norm, RoPE, rounded to bf16 (kv.cu's attention_inputs)
                load_head<T>(token_qkv + (i64)(heads + kvh) * HEAD_DIM, lane, x);
                norm_rope(x, lane, k_norm, eps, rotate, cos_table, sin_table, positions[q_start]);
#pragma unroll
                for (int e = 0; e < PER_LANE; ++e) x[e] = round_to<T>(x[e]);
                store_vector(x, lane, slot, kvh, kv_heads, page_size, k_cache, k_scale, k_smooth);
            } else {  // the value, as it is
                load_head<T>(token_qkv + (i64)(heads + kv_heads + kvh) * HEAD_DIM, lane, x);
                store_vector(x, lane, slot, kvh, kv_heads, page_size, v_cache, v_scale, nullptr);
            }
        }
        __syncthreads();  // the new key and value are in the cache before this block copies them
    }
#endif
#pragma unroll
    for (int i = 0; i < KV_STAGES - 1; ++i) {
        issue(i, i, page);
        page = page_of(i + 1);
    }

    // --- the query tile (rows past `rows` are zeros), while the first K/V copies fly ---
#if FUSED_INPUTS
    for (int r = warp; r < m_tiles * 16; r += WARPS) {
        if (r < rows) {
            float x[PER_LANE];
            load_head<T>(token_qkv + (i64)(kvh * group + r) * HEAD_DIM, lane, x);
            norm_rope(x, lane, q_norm, eps, rotate, cos_table, sin_table, positions[q_start]);
            store_head<bf16_t>(q_row, lane, x);  // the bf16 query attention_inputs would write
            __syncwarp();
        }
#if KV_INT8
        store_query_row_int8(sm, r < rows ? q_row : nullptr, k_smooth, kvh, r, lane);
#else
        for (int c = lane; c < CHUNKS; c += 32) {
            const uint4 v = r < rows ? reinterpret_cast<const uint4*>(q_row)[c] : make_uint4(0, 0, 0, 0);
            store_query_chunk(sm.q[0], sm.q[Q_PARTS - 1], v, k_smooth, kvh, r, c);
        }
#endif
        __syncwarp();  // q_row is rewritten by the warp's next row
    }
#elif KV_INT8
    for (int r = warp; r < m_tiles * 16; r += WARPS) {
        const int rg = m0 + r;
        const bf16_t* src = rg < rows ? q + ((i64)(q_start + rg / group) * heads + kvh * group + rg % group) * HEAD_DIM
                                      : nullptr;
        store_query_row_int8(sm, src, k_smooth, kvh, r, lane);
    }
#else
    load_query_tile(sm.q[0], sm.q[Q_PARTS - 1], q, k_smooth, m_tiles * 16, m0, rows, q_start, group,
                    kvh, heads);
#endif
    __syncthreads();  // the query tile is complete: the loop's only block-wide dependency

    // Per thread and m-tile: rows g and g + 8; running max / sum in the log2 domain.
    float row_max[M_TILES][2], row_sum[M_TILES][2];  // row_sum: this thread's columns only
    float o_acc[M_TILES][HEAD_DIM / 8][4];
#if KV_INT8
    // Per row: the query's scale times scale_log2, applied to each int32 score.
    float row_coef[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) row_coef[mt][h] = sm.q_scale[mt * 16 + g + 8 * h] * scale_log2;
#endif
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
        row_max[mt][0] = row_max[mt][1] = neg_inf();
        row_sum[mt][0] = row_sum[mt][1] = 0.0f;
#pragma unroll
        for (int d = 0; d < HEAD_DIM / 8; ++d)
            o_acc[mt][d][0] = o_acc[mt][d][1] = o_acc[mt][d][2] = o_acc[mt][d][3] = 0.0f;
    }

    for (int it = 0; it < n_tiles; ++it) {
        const int stage = it % KV_STAGES;
#if KV_STAGES == 1
        __syncwarp();  // every lane is done with tile it - 1
        issue(it, 0, page);
        page = page_of(it + 1);
        cp_async_wait<0>();
#else
        cp_async_wait<KV_STAGES - 2>();  // this lane's copies of tile `it` have landed
        __syncwarp();  // ... and every lane's; every lane is done with tile it - 1, refilled next
        issue(it + KV_STAGES - 1, (it + KV_STAGES - 1) % KV_STAGES, page);
        page = page_of(it + KV_STAGES);  // read now, used next iteration: its latency hides
#endif
        const int kv0 = tile_start(it) + warp * KEYS;  // the warp's 16 keys
        if (kv0 >= tile_end(it)) continue;  // all past the keys: masked for every row, a no-op
        const WarpSlice& in = sm.ring.stage[stage][warp];
        __syncwarp();  // every lane's copies are visible (KV_STAGES 1)

        // --- S = Q K^T: per m-tile 16 rows x the warp's 16 keys (2 n-tiles of 8) ---
        float s[M_TILES][2][4];
#if KV_INT8
        // s = (256 hi + lo) * the row's coefficient; the key scales come with the masking.
        int s_int[2][M_TILES][2][4];  // [part][m-tile][n-tile][element]
        scores_int8(s_int, sm, in, m_tiles, lane);
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)  // |256 hi + lo| < 2^31 (HEAD_DIM <= 256)
                    s[mt][j][e] = (float)(s_int[0][mt][j][e] * 256 + s_int[1][mt][j][e]) *
                                  row_coef[mt][e >> 1];
#else
        scores_bf16(s, sm, in.k, m_tiles, lane);
#endif

        // --- scale, mask, online softmax; P as the A fragment of one m16n8k16 k-step ---
        u32 p_frag[M_TILES][4];
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
            if (mt >= m_tiles) break;
            float tile_max[2] = {neg_inf(), neg_inf()};
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = j * 8 + 2 * t + (e & 1), pos = kv0 + key, h = e >> 1;
#if KV_INT8
                    float v = s[mt][j][e] * in.k_scale[key];  // s has the query's scale and log2(e)
#else
                    float v = s[mt][j][e] * scale_log2;
#endif
                    if (pos < row_lo[mt][h] || pos >= row_hi[mt][h]) v = neg_inf();
                    s[mt][j][e] = v;
                    tile_max[h] = fmaxf(tile_max[h], v);
                }
            float alpha[2], base[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(FULL, tile_max[h], 1));
                tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(FULL, tile_max[h], 2));
                const float new_max = fmaxf(row_max[mt][h], tile_max[h]);
                base[h] = new_max == neg_inf() ? 0.0f : new_max;  // a fully masked row stays at zero
                // 1 where the max did not change (also for a fully masked row, such as the padding
                // rows past `rows`: so that they do not force the rescale below on every tile)
                alpha[h] = new_max == row_max[mt][h] ? 1.0f : exp2f(row_max[mt][h] - base[h]);
                row_max[mt][h] = new_max;
                row_sum[mt][h] *= alpha[h];
            }
            if (__any_sync(FULL, alpha[0] != 1.0f || alpha[1] != 1.0f)) {  // x * 1 == x: skip
#pragma unroll
                for (int d = 0; d < HEAD_DIM / 8; ++d) {
                    o_acc[mt][d][0] *= alpha[0];
                    o_acc[mt][d][1] *= alpha[0];
                    o_acc[mt][d][2] *= alpha[1];
                    o_acc[mt][d][3] *= alpha[1];
                }
            }
            float p[2][4];
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    p[j][e] = exp2f(s[mt][j][e] - base[e >> 1]);
                    row_sum[mt][e >> 1] += p[j][e];
#if KV_INT8
                    p[j][e] *= in.v_scale[j * 8 + 2 * t + (e & 1)];
#endif
                }
            p_frag[mt][0] = pack_bf16x2(p[0][0], p[0][1]);  // row g, keys 2t, 2t + 1
            p_frag[mt][1] = pack_bf16x2(p[0][2], p[0][3]);  // row g + 8
            p_frag[mt][2] = pack_bf16x2(p[1][0], p[1][1]);  // row g, keys 8 + 2t, 8 + 2t + 1
            p_frag[mt][3] = pack_bf16x2(p[1][2], p[1][3]);  // row g + 8
        }

        // --- O += P V: k = the warp's 16 keys, n = HEAD_DIM (V fragments shared by the m-tiles) ---
#if KV_INT8
        // Straight from the copied int8 pages: a transposing ldmatrix of 16 keys x 32 dims gives
        // lane (g, t) the bytes of keys 2t, 2t + 1 (r0; r1: 8 + 2t, 9 + 2t) at dims 2g, 2g + 1
        // of each 16-dim chunk, which make the bf16 B fragments of two n-tiles: columns g =
        // dims 2g (the even bytes) and 2g + 1 (the odd ones). So o_acc n-tile 2c + p holds dims
        // 16c + 2col + p of chunk c (d0: dim 16c + 4t + p, d1: 16c + 4t + 2 + p).
#pragma unroll
        for (int dp = 0; dp < HEAD_DIM / 32; ++dp) {
            u32 r0, r1, r2, r3;
            const int key = (lane & 7) + ((lane >> 3) & 1) * 8, c = dp * 2 + (lane >> 4);
            ldmatrix_x4_trans(r0, r1, r2, r3, smem_addr(&in.v_raw[raw_chunk(key, c)]));
            const u32 b[4][2] = {{int8_even_to_bf16x2(r0), int8_even_to_bf16x2(r1)},
                                 {int8_odd_to_bf16x2(r0), int8_odd_to_bf16x2(r1)},
                                 {int8_even_to_bf16x2(r2), int8_even_to_bf16x2(r3)},
                                 {int8_odd_to_bf16x2(r2), int8_odd_to_bf16x2(r3)}};
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt) {
                if (mt >= m_tiles) break;
                const u32* a = p_frag[mt];
#pragma unroll
                for (int n = 0; n < 4; ++n)
                    mma_bf16_16816(o_acc[mt][4 * dp + n], a[0], a[1], a[2], a[3], b[n][0], b[n][1]);
            }
        }
#else
        pv_bf16(o_acc, p_frag, in.v, m_tiles, lane);
#endif
    }

#if PDL_TRIGGER == 1
    pdl_launch_dependents();  // this block's K/V loads are done
#endif
    cp_async_wait<0>();  // no copy may still target the ring, whose memory is reused below
    __syncthreads();     // every warp is done with the ring

    store_warp_state(sm, row_max, row_sum, o_acc, m_tiles, warp, g, t);
    __syncthreads();

    // One active split holds every key of the tile's rows: its normalized output is what the
    // combine of that one split would write (weight exp2(0) = 1), so it is written directly.
    const bool split_mode = active_splits > 1;
    merge_warp_states(sm, out, ws, split_mode, split, ws_splits, m_tiles, m0, rows, q_start, group,
                      kvh, heads, tid);
    if (!split_mode) return;

    // --- split-KV: the last block of this row tile combines the splits (as attention.cu) ---
    const int row_tiles = gridDim.x / grid_splits;
    int* counter = reinterpret_cast<int*>(ws) +
                   ((i64)(b * kv_heads + kvh) * row_tiles + row_tile) * WS_ROW + HEAD_DIM + 1;
    if (!last_split_to_arrive(counter, active_splits)) return;
    for (int r = warp; r < m_tiles * 16; r += WARPS) {  // a warp per row, lanes over head_dim
        const int rg = m0 + r;
        if (rg >= rows) break;
        const i64 token = q_start + rg / group, head = kvh * group + rg % group;
        combine_split_row(out + (token * heads + head) * HEAD_DIM,
                          ws + (token * heads + head) * ws_splits * WS_ROW, active_splits, lane);
    }
    if (tid == 0) *counter = 0;  // ready for the next launch (and the next graph replay)
}
