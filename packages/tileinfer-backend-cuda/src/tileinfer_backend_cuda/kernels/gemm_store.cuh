// The sums of gemm_invariant.cu's and gemm_wgmma.cu's blocks and their end (included after a
// kernel's WT, NT, MATS, ROW_TILES, WARP_ROWS, BLOCK_ROWS, THREADS, TOKEN_GROUPS, RUNS, PER_RUN,
// SPLIT and out_t, and after gemv_epilogue.cuh): a warp's sums of one kind, their fold,
// close_parts (the parts' ends), and store_sums, which writes the block's sums to out through
// gemv.cu's scales, epilogue and rounding: directly, or (SPLIT) through the cluster, each block
// finishing a slice of its row tile's outputs from the runs' sums in the cluster's shared memory,
// in run order.
//
// A warp's sums: [tile m][token tile j][mma element e] in mma.sync's accumulator layout
// (wgmma's per warp too): e 0, 1 = row g, tokens 8j + 2t, + 1; e 2, 3 = row g + 8; tile m is
// matrix m / ROW_TILES, rows WARP_ROWS w + 16 (m % ROW_TILES) of the block's tile, where the
// block's warps are TOKEN_GROUPS groups of ROW_GROUP_WARPS, warp w of group q taking the tokens
// from 8 NT q of the block's.
#pragma once

typedef float Sums[WT][NT][4];
constexpr int ROW_GROUP_WARPS = THREADS / 32 / TOKEN_GROUPS;
constexpr int BLOCK_TOKENS = 8 * NT * TOKEN_GROUPS;

// into += from; from = 0 (a part's sum joins its run's, a run's the block's).
__device__ __forceinline__ void fold(Sums& into, Sums& from) {
#pragma unroll
    for (int m = 0; m < WT; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                into[m][j][e] += from[m][j][e];
                from[m][j][e] = 0.0f;
            }
}

// The parts from `next` to `upto` have ended: each part's sum (acc) joins its run's (run), an
// ended run's joins the block's (sum: unsplit with several runs; else unused). Empty parts add
// their zero too, as gemv.cu's warps without steps do.
__device__ __forceinline__ void close_parts(int& next, int upto, Sums& acc, Sums& run, Sums& sum) {
    for (; next < upto; ++next) {
        fold(run, acc);
#if !SPLIT && RUNS > 1
        if ((next + 1) % PER_RUN == 0) fold(sum, run);  // a run ends
#endif
    }
}

#if SPLIT
#define CLUSTER_DIMS __cluster_dims__(1, RUNS, 1)  // a row tile's runs (grid.y) in one cluster
#else
#define CLUSTER_DIMS
#endif

// out[tok][row] for the block's rows from block_base and its n tokens, from close_parts' sums:
// the block's run (SPLIT, or one run: its sum is the row's, 0 + run == run) or all runs' (sum).
// x_scale: the block's tokens' FP8 scales (W_FP8). smem: the block's shared memory, free of its
// ring.
__device__ __forceinline__ void store_sums(Sums& run, Sums& sum, out_t* __restrict__ out,
                                           const float* __restrict__ w_scale,
                                           const float* __restrict__ x_scale, int n, int O,
                                           int block_base, int run_lo, void* smem, float alpha_p,
                                           float alpha_n, float beta, float eps) {
#if !SPLIT && RUNS > 1
    Sums& done = sum;
#else
    Sums& done = run;
#endif
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % ROW_GROUP_WARPS;
    const int g = lane >> 2, t = lane & 3;
    const int tok0 = (threadIdx.x >> 5) / ROW_GROUP_WARPS * 8 * NT;  // its token group's first
    auto finish = [&](int tok, int row, const float (&s)[MATS]) {
        float v[MATS];
#pragma unroll
        for (int m = 0; m < MATS; ++m) v[m] = scaled_sum(s[m], m, tok, row, O, w_scale, x_scale);
        out[(i64)tok * O + row] = from_float<out_t>(epilogue_value(v, alpha_p, alpha_n, beta, eps));
    };
#if SPLIT
    // The run's sums to this block's shared memory, [mat][token][row of the tile], once every
    // warp is done with the ring; then block q of the cluster finishes outputs q THREADS + i,
    // (q + RUNS) THREADS + i, ... (output idx: token idx / BLOCK_ROWS, row idx % BLOCK_ROWS).
    __syncthreads();
    float* sums = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int m = 0; m < WT; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int tok = tok0 + 8 * j + 2 * t + (e & 1);
                const int r = WARP_ROWS * warp + 16 * (m % ROW_TILES) + g + (e >> 1) * 8;
                sums[((m / ROW_TILES) * BLOCK_TOKENS + tok) * BLOCK_ROWS + r] = done[m][j][e];
            }
    cluster_sync();  // every run's sums are in place
    // A thread takes TAIL_UNROLL outputs at a time and loads all their runs' sums before it adds
    // any: the tail is bound by the other SMs' latency, not by bytes.
    constexpr int TAIL_UNROLL = 8;
    const int outputs = BLOCK_ROWS * n;
    for (int base = run_lo * THREADS + threadIdx.x; base < outputs;
         base += RUNS * THREADS * TAIL_UNROLL) {
        float part[TAIL_UNROLL][RUNS][MATS];
#pragma unroll
        for (int u = 0; u < TAIL_UNROLL; ++u) {
            const int idx = min(base + u * RUNS * THREADS, outputs - 1);
            const int tok = idx / BLOCK_ROWS, r = idx % BLOCK_ROWS;
#pragma unroll
            for (int q = 0; q < RUNS; ++q)
#pragma unroll
                for (int m = 0; m < MATS; ++m)
                    part[u][q][m] =
                        cluster_load(sums + (m * BLOCK_TOKENS + tok) * BLOCK_ROWS + r, q);
        }
#pragma unroll
        for (int u = 0; u < TAIL_UNROLL; ++u) {
            const int idx = base + u * RUNS * THREADS;
            const int tok = idx / BLOCK_ROWS, r = idx % BLOCK_ROWS;
            if (idx >= outputs || block_base + r >= O) continue;
            float s[MATS];
#pragma unroll
            for (int m = 0; m < MATS; ++m) {
                s[m] = 0.0f;
#pragma unroll
                for (int q = 0; q < RUNS; ++q) s[m] += part[u][q][m];
            }
            finish(tok, block_base + r, s);
        }
    }
    cluster_sync();  // this block's sums stay until the cluster has read them
#else
    const int warp_base = block_base + WARP_ROWS * warp;
#pragma unroll
    for (int r = 0; r < ROW_TILES; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int tok = tok0 + 8 * j + 2 * t + (e & 1);
                const int row = warp_base + 16 * r + g + (e >> 1) * 8;
                if (tok >= n || row >= O) continue;
                float s[MATS];
#pragma unroll
                for (int m = 0; m < MATS; ++m) {
#if RUNS > 1
                    s[m] = done[m * ROW_TILES + r][j][e];
#else
                    s[m] = 0.0f + done[m * ROW_TILES + r][j][e];  // one run: 0 + the run's sum
#endif
                }
                finish(tok, row, s);
            }
#endif
}
