// Batch-invariant GEMM for batched steps: out (n, O) = x (n, K) @ W.T in blocks of 8 * NT
// tokens, with gemv.cu's sums to the bit: a row and token gets the same value here as from
// gemv.cu's batch-invariant build of the same weight at any number of rows (1 included), so a
// step can take either kernel. Same contract and arguments as gemv.cu (bf16 or INT8 weights).
//
// gemv.cu's sum of a row: its K steps (STEP_K wide) are dealt to PARTS warps (part p takes the
// steps p, p + PARTS, ..., in chunks of PART_CHUNK, or a contiguous range with BLOCKED_PARTS:
// gemv_parts.cuh); each part's steps go through the tensor cores in order from zero (the same
// products: gemv_frag.cuh, or gemv_nk.cuh with NK_PRODUCTS); the parts' sums are added in RUNS
// runs of PARTS / RUNS parts, each run from zero in part order, then the runs in order. Here a
// block's warps split the rows instead of K (ROW_WARPS warps of ROW_TILES 16-row tiles of each
// matrix), share each step's x chunks through shared memory, and walk the parts one after
// another: the block's steps in part order, a part's sum added to its run's when the part ends.
//
// SPLIT = 1 puts each run in a block of its own (narrow weights fill the GPU so),
// a row tile's RUNS blocks in one cluster (sm_90): each block keeps its run's sums in its shared
// memory, then finishes a slice of the tile's outputs, adding the runs' sums from the cluster's
// blocks (distributed shared memory) in run order. SPLIT = 0: a block adds its runs itself.
//
// Pipeline: STAGES stages of shared memory, each STAGE_STEPS slots of one step: the step's weight
// chunks of every warp (a lane copies its own cells, gemv.cu's lane's) and its x chunks of every
// token tile (copied by all threads, read by every warp). One barrier a stage (its copies have
// landed for everyone, and the stage read before may be refilled).
//
// Grid: (token blocks of 8 NT, row tiles of 16 ROW_TILES ROW_WARPS x (SPLIT ? RUNS : 1)), y = row
// tile RUNS + run: a row tile's token blocks run together (its weight from L2 after the first);
// block: ROW_WARPS * 32 threads; dynamic shared memory: gemm_smem_bytes (ops/gemm_invariant.py).
// PDL = 1 as in gemv.cu: the first stages' weight copies before pdl_wait, x and writes after it.
//
// Defines: W_INT8 (0/1), W_E4M3 (0/1: the one-byte weights are e4m3, common.cuh),
// INT8_LOAD (16 or 8), EPILOGUE (0 none, 1 SwiGLU, 2 xIELU), OUT_DTYPE,
// ROUND_BF16, PARTS, RUNS, BLOCKED_PARTS, PART_CHUNK and NK_PRODUCTS (the order of the sums:
// gemv.cu's WARPS, RUNS, BLOCKED_PARTS, PART_CHUNK and NK_PRODUCTS), ROW_WARPS, ROW_TILES,
// STAGES, STAGE_STEPS, NT, SPLIT (0/1), K_ALIGNED (0/1), STREAM_L2_256B, PDL (0/1).
#include "common.cuh"

#ifndef W_INT8
#define W_INT8 0
#endif
#define W_FP8 0
#ifndef INT8_LOAD
#define INT8_LOAD 16
#endif
#ifndef EPILOGUE
#define EPILOGUE 0
#endif
#ifndef OUT_DTYPE
#define OUT_DTYPE bf16_t
#endif
#ifndef ROUND_BF16
#define ROUND_BF16 1
#endif
#ifndef PARTS
#define PARTS 8
#endif
#ifndef RUNS
#define RUNS 1
#endif
#ifndef ROW_WARPS
#define ROW_WARPS 4
#endif
#ifndef ROW_TILES
#define ROW_TILES 1
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef STAGE_STEPS
#define STAGE_STEPS 1
#endif
#ifndef NT
#define NT 8
#endif
#ifndef SPLIT
#define SPLIT 0
#endif
#ifndef K_ALIGNED
#define K_ALIGNED 0  // 1: K is a multiple of STEP_K, so every chunk of every step holds data
#endif
#ifndef PDL
#define PDL 0
#endif
typedef OUT_DTYPE out_t;
static_assert(PARTS % RUNS == 0, "RUNS: runs of whole parts");
static_assert(STAGES >= 2, "a stage in use and one being filled");

constexpr int MATS = EPILOGUE == 1 ? 2 : 1;  // weight matrices: gate (and up)
constexpr int WT = MATS * ROW_TILES;         // 16-row tiles a warp owns: ROW_TILES of each matrix
constexpr int WARP_ROWS = 16 * ROW_TILES;
constexpr int BLOCK_ROWS = WARP_ROWS * ROW_WARPS;
constexpr int THREADS = ROW_WARPS * 32;
constexpr int TOKEN_GROUPS = 1;  // gemm_store.cuh: every warp takes the block's 8 NT tokens
constexpr int PER_RUN = PARTS / RUNS;
// gemv.cu's lane and step geometry (gemv_frag.cuh reads these names).
constexpr int LANE_K = W_INT8 ? INT8_LOAD : 8;
constexpr int STEP_K = 4 * LANE_K;
constexpr int W_BYTES = W_INT8 ? INT8_LOAD : 16;
constexpr int XVECS = LANE_K / 8;
// A step's slot: [warp][2 * WT][lane's cell] weight cells (rows g and g + 8 of each tile), then
// [token tile][XVECS][lane's cell] x cells, 16 bytes each (cell: the lane, or nk_cell). Step i
// takes step i % STAGE_STEPS of ring stage (i / STAGE_STEPS) % STAGES.
constexpr int W_CELLS = ROW_WARPS * 2 * WT * 32;
constexpr int X_CELLS = NT * XVECS * 32;
constexpr int SLOT_CELLS = W_CELLS + X_CELLS;

#if W_INT8
typedef signed char w_t;
#else
typedef bf16_t w_t;
#endif
typedef bf16_t x_t;

#include "gemv_frag.cuh"      // copy_w, Frag, to_frag, step_mma
#include "gemv_nk.cuh"        // NK_PRODUCTS: nk_cell, nk_a, nk_b, nk_mma
#include "gemv_epilogue.cuh"  // scaled_sum, epilogue_value
#include "gemv_parts.cuh"     // part_steps, PartWalk (BLOCKED_PARTS, PART_CHUNK)
#include "gemm_store.cuh"     // Sums, fold, close_parts, CLUSTER_DIMS, store_sums

extern "C" __global__ void __launch_bounds__(THREADS) CLUSTER_DIMS
gemm_invariant(out_t* __restrict__ out, const x_t* __restrict__ x, const w_t* __restrict__ w,
               const float* __restrict__ w_scale, int n, int K, int O, i64 x_stride,
               float alpha_p, float alpha_n, float beta, float eps) {
    extern __shared__ uint4 stages[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int block_base = (SPLIT ? blockIdx.y / RUNS : blockIdx.y) * BLOCK_ROWS;
    const int warp_base = block_base + WARP_ROWS * warp;
    // This block's tokens: x, out and n from its token block's first row on.
    x += (i64)blockIdx.x * 8 * NT * x_stride;
    out += (i64)blockIdx.x * 8 * NT * O;
    n = min(n - (int)blockIdx.x * 8 * NT, 8 * NT);
    // This block's runs (its rank in the cluster) and parts.
    const int run_lo = SPLIT ? blockIdx.y % RUNS : 0, run_hi = SPLIT ? run_lo + 1 : RUNS;
    const int part_lo = run_lo * PER_RUN, part_hi = run_hi * PER_RUN;
    const int steps = (K + STEP_K - 1) / STEP_K;
    int total = 0;  // the block's steps
    for (int p = part_lo; p < part_hi; ++p) total += part_steps(p, steps, PARTS);

    // This lane's weight rows (rows past O read row O - 1 again; their sums are dropped) as byte
    // offsets from w (under 4 GB: gemm_invariant.fits), to which a step's copy adds its k (ptxas
    // recomputes 64-bit row pointers every step). Tile m: matrix m / ROW_TILES, rows warp_base +
    // 16 (m % ROW_TILES) + g (and + 8).
    const char* wbytes = reinterpret_cast<const char*>(w);
    u32 wrow[WT][2];
#pragma unroll
    for (int m = 0; m < WT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const i64 row = min(warp_base + 16 * (m % ROW_TILES) + g + 8 * h, O - 1);
            wrow[m][h] = (u32)((((m / ROW_TILES) * O + row) * K + t * LANE_K) * sizeof(w_t));
        }
    const u32 base_addr = smem_addr(stages);
    const int my_cell = NK_PRODUCTS ? nk_cell(g, t) : lane;  // this lane's cell of a part
    const NkLane nk = nk_lane(lane);
    auto slot_addr = [&](int s) { return base_addr + (u32)(s * SLOT_CELLS * 16); };

    // Copies of one step (at k) into slot s; a lane's chunk past K is zeros, as in gemv.cu.
    auto issue_w = [&](int s, int k) {
        const bool valid = K_ALIGNED || k + t * LANE_K < K;
        const u32 kb = valid ? (u32)(k * sizeof(w_t)) : 0u;
        const u32 cells = slot_addr(s) + (u32)((warp * 2 * WT) * 32 + my_cell) * 16;
#pragma unroll
        for (int m = 0; m < WT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                copy_w(cells + (2 * m + h) * 512, (const w_t*)(wbytes + (wrow[m][h] + kb)), valid);
    };
    // This thread's x cells, c = threadIdx.x + q THREADS (cell c: token tile j, chunk v, lane
    // (gx, tx): x[token 8j + gx][k + tx LANE_K + 8v ..]), their rows and offsets computed once.
    constexpr int X_PER_THREAD = (X_CELLS + THREADS - 1) / THREADS;
    const char* xbytes = reinterpret_cast<const char*>(x);
    u32 xrow[X_PER_THREAD], xchunk[X_PER_THREAD];  // byte offsets: from x, in the row
    int xcell[X_PER_THREAD], xlane_k[X_PER_THREAD];  // among the slot's x cells; k in a step
#pragma unroll
    for (int q = 0; q < X_PER_THREAD; ++q) {
        const int c = min((int)threadIdx.x + q * THREADS, X_CELLS - 1);
        const int j = c / (XVECS * 32), v = c / 32 % XVECS, cl = c % 32;
        const int gx = cl >> 2, tx = cl & 3;
        xlane_k[q] = tx * LANE_K;
        xrow[q] = (u32)(min(8 * j + gx, n - 1) * x_stride * sizeof(x_t));
        xcell[q] = (j * XVECS + v) * 32 + (NK_PRODUCTS ? nk_cell(gx, tx) : cl);
        xchunk[q] = (u32)((tx * LANE_K + 8 * v) * sizeof(x_t));
    }
    auto issue_x = [&](int s, int k) {
        const u32 cells = slot_addr(s) + (u32)W_CELLS * 16;
#pragma unroll
        for (int q = 0; q < X_PER_THREAD; ++q) {
            if (X_CELLS % THREADS != 0 && (int)threadIdx.x + q * THREADS >= X_CELLS) break;
            const bool valid = K_ALIGNED || k + xlane_k[q] < K;
            const u32 kb = valid ? (u32)(k * sizeof(x_t)) + xchunk[q] : 0u;
            cp_async_ca16(cells + (u32)xcell[q] * 16, xbytes + (xrow[q] + kb), valid ? 16 : 0);
        }
    };

    Sums acc = {}, run = {}, sum = {};  // a part's, its run's, the block's (close_parts)

    PartWalk fill{part_lo, 0, 0};
    fill.enter(part_hi, steps, PARTS);
    PartWalk read = fill;
    const int stage_count = (total + STAGE_STEPS - 1) / STAGE_STEPS;
    // Stage st's copies (its steps that exist) into ring stage r (st % STAGES); `c` moves on.
    auto issue_stage = [&](int st, int r, PartWalk& c, bool weights, bool xs) {
#pragma unroll
        for (int u = 0; u < STAGE_STEPS; ++u) {
            const int i = st * STAGE_STEPS + u;
            if (i < total) {
                if (weights) issue_w(r * STAGE_STEPS + u, c.step * STEP_K);
                if (xs) issue_x(r * STAGE_STEPS + u, c.step * STEP_K);
            }
            c.advance(part_hi, steps, PARTS);
        }
    };
#if PDL
    pdl_launch_dependents();
    {
        PartWalk c = fill;
        for (int st = 0; st < STAGES - 1; ++st) issue_stage(st, st, c, true, false);
    }
    pdl_wait();  // x and the output belong to the previous kernels from here on
    for (int st = 0; st < STAGES - 1; ++st) issue_stage(st, st, fill, false, true);
    cp_async_commit();
    for (int st = 1; st < STAGES - 1; ++st) cp_async_commit();  // empty: STAGES - 1 groups in all
#else
    for (int st = 0; st < STAGES - 1; ++st) {
        issue_stage(st, st, fill, true, true);
        cp_async_commit();
    }
#endif

    int next_part = part_lo;  // the first part whose sum has not been added

    // Ring stages of stage st and of st + STAGES - 1 (st - 1's), kept as counters: no division.
    for (int st = 0, read_r = 0, fill_r = STAGES - 1; st < stage_count; ++st) {
        cp_async_wait<STAGES - 2>();  // stage st's copies (this thread's) have landed
        __syncthreads();              // everyone's; and stage st - 1's slots are free
        issue_stage(st + STAGES - 1, fill_r, fill, true, true);  // into stage st - 1's slots
        cp_async_commit();
#pragma unroll
        for (int u = 0; u < STAGE_STEPS; ++u) {
            const int i = st * STAGE_STEPS + u;
            if (i >= total) break;
            close_parts(next_part, read.part, acc, run, sum);  // those that ended before it
#if NK_PRODUCTS
            const u32 parts = slot_addr(read_r * STAGE_STEPS + u);  // part i: cells 32 i ..
            u32 a[WT][2][4];
#pragma unroll
            for (int m = 0; m < WT; ++m) {
                nk_a(a[m], parts + (u32)(warp * 2 * WT + 2 * m) * 512, nk);
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                u32 b[4];
                nk_b(b, parts + (u32)(W_CELLS + 32 * j) * 16, nk);
#pragma unroll
                for (int m = 0; m < WT; ++m) nk_mma(acc[m][j], a[m], b);
            }
#else
            const uint4* slot = stages + (read_r * STAGE_STEPS + u) * SLOT_CELLS;
            const uint4* wcells = slot + warp * 2 * WT * 32 + lane;
            Frag f[WT];
#pragma unroll
            for (int m = 0; m < WT; ++m)
                to_frag(f[m], wcells[(2 * m) * 32], wcells[(2 * m + 1) * 32]);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                uint4 xv[XVECS];
#pragma unroll
                for (int v = 0; v < XVECS; ++v) xv[v] = slot[W_CELLS + (j * XVECS + v) * 32 + lane];
#pragma unroll
                for (int m = 0; m < WT; ++m) step_mma(acc[m][j], f[m], xv);
            }
#endif
            read.advance(part_hi, steps, PARTS);
        }
        read_r = read_r + 1 == STAGES ? 0 : read_r + 1;
        fill_r = fill_r + 1 == STAGES ? 0 : fill_r + 1;
    }
    cp_async_wait<0>();
    close_parts(next_part, part_hi, acc, run, sum);
    store_sums(run, sum, out, w_scale, nullptr, n, O, block_base, run_lo, stages, alpha_p,
               alpha_n, beta, eps);
}
