// gemm_invariant.cu's sums on Hopper's warpgroup products (wgmma, sm_90a: built with
// ARCH_SPECIFIC), for the weights whose batch-invariant order takes products of neighbouring k
// (NK_PRODUCTS) in contiguous parts (BLOCKED_PARTS, or one part): the same sums in the same
// order, so a row gets gemv.cu's bits. bf16 weights, K a multiple of 64 (ops/gemm_wgmma.py), or
// FP8 weights and tokens (W_FP8, below: batched FP8 products, not batch-invariant); the
// epilogues and outputs of gemm_invariant.cu (SwiGLU: gate and up tiles, two sums a row).
//
// The order (gemm_invariant.cu's header): K in steps of 32; part p takes the contiguous steps
// p per .. p per + per - 1 (per = ceil(steps / PARTS)) and adds their products of 16 neighbouring
// k in order from zero; the parts' sums are added in RUNS runs, each from zero in part order,
// then the runs in order. wgmma adds a product of 16 k to mma.sync's bits whatever its tile
// shape (benchmarks/wgmma_bits.cu).
//
// A block: WG x TG warpgroups, WG of 64 weight rows each (of each matrix) for each of TG token
// groups of 8 NT tokens (the block's token block: more groups, fewer reads of the weight from L2
// in a launch of many tokens); warpgroup w takes rows 64 (w % WG) and tokens 8 NT (w / WG).
// Both operands come from shared memory through descriptors, in wgmma's K-major layout with the
// 128-byte swizzle (gemm_wgmma_layout.cuh): a stage of 64 k holds each row's 128 bytes in a row
// of its own, the block's weight rows of every matrix, then its tokens.
// STAGES stages through cp.async, one barrier a stage; a part's products stay in flight until
// the part ends (its sum is then added to its run's). MMA_LAG = 1: a stage's products stay in
// flight through the next stage's barrier and copies (the copies run STAGES - 2 stages ahead,
// not STAGES - 1, so the slot refilled is the one of two stages back). TMA = 1: a stage's
// weight rows come in one bulk tensor copy a matrix (tma.cuh) from the tensor map w_map, whose
// 128-byte swizzle gives the same layout, awaited on the slot's mbarrier; the tokens stay on
// cp.async.
//
// Grid, clusters and the end as gemm_invariant.cu's (gemm_store.cuh): (token blocks of 8 NT TG,
// row tiles x (SPLIT ? RUNS : 1)), a row tile's runs one cluster, each block finishing a slice of
// the tile's outputs from the runs' sums in the cluster's shared memory, in run order. Dynamic
// shared memory: gemm_wgmma.smem_bytes (the ring from the first 1024-byte boundary, then with TMA
// an mbarrier a stage after the ring or the split's sums). PDL as gemm_invariant.cu.
//
// W_FP8 = 1: the FP8 product of tileinfer/backend/fp8.py (ops/gemm_fp8.py), e4m3 weights with row
// scales (w_scale) by the tokens' e4m3 values (fp8_quant.cu) with their scales (x_scale). The
// kernel walks such rows as pairs of bytes: K, x_stride and the tensor map count 2-byte units, so
// a step of 32 units is 64 e4m3 k (two products of 32 k) and a stage's 128 bytes a row are 128 k,
// in the layout and through the descriptors of bf16's. Each part's products start from zero and
// its sum joins its run's in float32 on the CUDA cores: Hopper's FP8 products keep fewer bits
// in their accumulator than float32 (DeepSeek-V3's report), so short parts bound the loss.
//
// Defines: EPILOGUE (0 none, 1 SwiGLU, 2 xIELU), OUT_DTYPE, ROUND_BF16, PARTS, RUNS, WG (1 or 2),
// STAGES, NT (4 or 8), TG (1, 2 or 4), SPLIT (0/1), TMA (0/1), MMA_LAG (0/1), STREAM_L2_256B,
// PDL (0/1), W_FP8 (0/1).
#include "common.cuh"

#ifndef SPLIT
#define SPLIT 0
#endif
#ifndef TMA
#define TMA 0
#endif
#ifndef MMA_LAG
#define MMA_LAG 0
#endif
#include "gemm_wgmma_block.cuh"  // defaults, out_t, MATS, BLOCK_ROWS, THREADS, TOKENS, W_STAGE, ..
static_assert(!MMA_LAG || STAGES >= 3, "MMA_LAG: a stage filling, one in products, one ending");

constexpr int AHEAD = MMA_LAG ? STAGES - 2 : STAGES - 1;  // stages of copies issued ahead
constexpr int XQ = TOKENS * 8 / THREADS;  // a thread's chunks of x (and of the weights: WQ)
static_assert(XQ >= 1 && XQ * THREADS == TOKENS * 8, "x chunks: whole rounds of the block");
static_assert(TMA || W_ROWS * 8 % THREADS == 0, "weight chunks: whole rounds of the block");

#include "gemv_epilogue.cuh"      // scaled_sum, epilogue_value
#include "gemm_store.cuh"         // Sums, close_parts, CLUSTER_DIMS, store_sums
#include "tma.cuh"                // mbar_init, mbar_expect_bytes, mbar_wait, tma_load_2d
#include "wgmma.cuh"              // wgmma_commit, wgmma_wait_*, wgmma_stage_step
#if TMA  // the slots' mbarriers: after the ring, or after the split's sums if they need more
constexpr int SUM_BYTES = SPLIT ? MATS * TOKENS * BLOCK_ROWS * 4 : 0;
constexpr int BAR_OFFSET = STAGES * STAGE_BYTES > SUM_BYTES ? STAGES * STAGE_BYTES : SUM_BYTES;
#else
constexpr int WQ = W_ROWS * 8 / THREADS;
#endif
extern "C" __global__ void __launch_bounds__(THREADS) CLUSTER_DIMS
gemm_wgmma(out_t* __restrict__ out, const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
           const void* __restrict__ w_map, int n, int K, int O, i64 x_stride,
           float alpha_p, float alpha_n, float beta, float eps,
           const float* __restrict__ w_scale, const float* __restrict__ x_scale) {
    extern __shared__ uint4 ring[];
    const int warp = threadIdx.x >> 5;
    const int block_base = (SPLIT ? blockIdx.y / RUNS : blockIdx.y) * BLOCK_ROWS;
    x += (i64)blockIdx.x * TOKENS * x_stride;
    out += (i64)blockIdx.x * TOKENS * O;
#if W_FP8
    x_scale += blockIdx.x * TOKENS;
#endif
    n = min(n - (int)blockIdx.x * TOKENS, TOKENS);
    const int run_lo = SPLIT ? blockIdx.y % RUNS : 0, run_hi = SPLIT ? run_lo + 1 : RUNS;
    const int part_lo = run_lo * PER_RUN, part_hi = run_hi * PER_RUN;
    // This block's steps (its parts' are contiguous), two a stage.
    const WgmmaSteps walk = wgmma_steps(part_lo, part_hi, K / 32, PARTS);
    const int first = walk.first, last = walk.last, per = walk.per;
    const int stage_count = (last - first + 1) / 2;

    // This thread's chunks of a stage: copies q = threadIdx.x + i THREADS (wgmma_chunk).
    const u32 base = (smem_addr(ring) + WGMMA_ALIGN - 1) & ~(u32)(WGMMA_ALIGN - 1);
    const bf16_t* xsrc[XQ];
    u32 xdst[XQ];
    int xk[XQ];
#if TMA
    auto bar = [&](int slot) { return base + (u32)(BAR_OFFSET + 8 * slot); };  // slot's barrier
    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) mbar_init(bar(i), 1);
        mbar_init_fence();
    }
    __syncthreads();
#else
    const bf16_t* wsrc[WQ];
    u32 wdst[WQ];
    int wk[WQ];
#pragma unroll
    for (int i = 0; i < WQ; ++i) {
        const WgmmaChunk q = wgmma_chunk(threadIdx.x + i * THREADS);
        const int m = q.row / BLOCK_ROWS, r = min(block_base + q.row % BLOCK_ROWS, O - 1);
        wsrc[i] = w + ((i64)m * O + r) * K + 8 * q.chunk;  // rows past O: dropped
        wdst[i] = wgmma_cell(q.row, q.chunk);
        wk[i] = 8 * q.chunk;
    }
#endif
#pragma unroll
    for (int i = 0; i < XQ; ++i) {
        const WgmmaChunk q = wgmma_chunk(threadIdx.x + i * THREADS);
        xsrc[i] = x + (i64)min(q.row, n - 1) * x_stride + 8 * q.chunk;  // past n: dropped
        xdst[i] = W_STAGE + wgmma_cell(q.row, q.chunk);
        xk[i] = 8 * q.chunk;
    }
    // Stage st's copies into ring slot `slot` (chunks past K: zeros; a last stage's second step
    // past the block's steps is copied but not added).
    auto issue = [&](int st, int slot, bool weights, bool xs) {
        if (st >= stage_count) return;
        const int k0 = (first + 2 * st) * 32;
        const u32 dst = base + (u32)(slot * STAGE_BYTES);
#if TMA  // one copy a matrix of its BLOCK_ROWS rows x 64 k (past K or the rows: zeros)
        if (weights && threadIdx.x == 0) {
            mbar_expect_bytes(bar(slot), (u32)W_STAGE);
            for (int m = 0; m < MATS; ++m)
                tma_load_2d(dst + (u32)(m * BLOCK_ROWS * 128), w_map, k0, m * O + block_base,
                            bar(slot));
        }
#else
#pragma unroll
        for (int i = 0; i < WQ; ++i) {
            const bool valid = k0 + wk[i] < K;
            if (weights) cp_async_cg16(dst + wdst[i], wsrc[i] + (valid ? k0 : 0), valid ? 16 : 0);
        }
#endif
#pragma unroll
        for (int i = 0; i < XQ; ++i) {
            const bool valid = k0 + xk[i] < K;
            if (xs) cp_async_ca16(dst + xdst[i], xsrc[i] + (valid ? k0 : 0), valid ? 16 : 0);
        }
    };
#if PDL
    pdl_launch_dependents();
    for (int st = 0; st < AHEAD; ++st) issue(st, st, true, false);
    pdl_wait();  // x and the output belong to the previous kernels from here on
    for (int st = 0; st < AHEAD; ++st) issue(st, st, false, true);
    cp_async_commit();
    for (int st = 1; st < AHEAD; ++st) cp_async_commit();  // empty: AHEAD groups in all
#else
    for (int st = 0; st < AHEAD; ++st) {
        issue(st, st, true, true);
        cp_async_commit();
    }
#endif

    Sums acc = {}, run = {}, sum = {};  // a part's, its run's, the block's (close_parts)
    int next_part = part_lo;  // the first part whose sum has not been added
    auto close = [&](int upto) {  // the parts before `upto`, once their products have landed
        if (next_part >= upto) return;
#if MMA_LAG
        wgmma_commit();  // the stage's products so far
#endif
        wgmma_wait_all();
        close_parts(next_part, upto, acc, run, sum);
    };
    const int a_row = 64 * ((warp >> 2) % WG);  // this warpgroup's first weight row in a stage
    const int b_row = 8 * NT * ((warp >> 2) / WG);  // and its first token
    for (int st = 0, slot = 0, phase = 0; st < stage_count; ++st) {
        cp_async_wait<AHEAD - 1>();  // stage st's copies (this thread's) have landed
        fence_proxy_async();
#if TMA
        mbar_wait(bar(slot), phase);  // and its weights
#endif
#if !MMA_LAG
        wgmma_wait_all();  // this warp's products of the stage before are done
#endif
        // Everyone's: st's slot is full, and the slot of stage st + AHEAD - STAGES (st - 1, or
        // with MMA_LAG st - 2, whose products wgmma_wait_one ended) may be refilled.
        __syncthreads();
        issue(st + AHEAD, slot + AHEAD < STAGES ? slot + AHEAD : slot + AHEAD - STAGES, true, true);
        cp_async_commit();
        const u32 stage = base + (u32)(slot * STAGE_BYTES);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int s = first + 2 * st + u;
            if (s >= last) break;
            close(s / per);  // the parts that ended before this step
            wgmma_stage_step(acc, stage, u, a_row, b_row);
#if !MMA_LAG
            wgmma_commit();
#endif
        }
#if MMA_LAG
        wgmma_commit();
        wgmma_wait_one();  // stage st - 1's products are done; st's run on
#endif
        slot = slot + 1 == STAGES ? 0 : slot + 1;
        phase ^= slot == 0;
    }
    cp_async_wait<0>();
    wgmma_wait_all();
    close(part_hi);
    store_sums(run, sum, out, w_scale, x_scale, n, O, block_base, run_lo, ring, alpha_p, alpha_n,
               beta, eps);
}
