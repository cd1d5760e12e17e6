// Batched FP8 products as one stream of K stages per SM (stream-K, sm_90a: built with
// ARCH_SPECIFIC), for ops/gemm_fp8_stream.py: gemm_wgmma.cu's W_FP8 product (its header: e4m3
// rows walked as pairs of bytes, a stage of 128 e4m3 k a part whose products start from zero and
// join the sum in float32) without its grid of (row tile, run) blocks, less than a wave, which
// leaves SMs idle through the launch's ramp and its uneven tail (docs/cuda-kernels.md).
//
// The work: ceil(O / BLOCK_ROWS) row tiles of K / (64 BOXES) stages each (K in 2-byte units), in
// one order, tile by tile and each tile's stages in K order. Block b of the grid's G takes the
// stages [b total / G, (b + 1) total / G): about as many as every other block, so each SM streams
// its share without a break between tiles (the ring runs on across them). A block's stages of one
// tile are a segment; every segment but a block's first starts a tile. A segment that holds a
// whole tile ends in the tile's outputs. A first segment that does not start its tile publishes
// its sums to `partials` (the block's slot) and raises the block's flag; the block whose segment
// starts that tile (always its last segment) waits for the flags of the blocks after it whose
// first segment lies in the tile, adds their sums to its own in block order (a fixed order: the
// same bits at every launch of the shape on the same GPU, whatever n) and writes the outputs. It
// lowers each flag it read, so the flags are zero between launches (a CUDA graph replays them).
// Only a block's last segment waits, and only on blocks whose first segment (published before
// they wait on anything) lies after it: no cycle; ops/gemm_fp8_stream.py sizes G so that every
// block is resident at once.
//
// A block: WG warpgroups of 64 weight rows (of each matrix) for the launch's n <= 8 NT tokens
// (one token block). A ring stage holds BOXES boxes of 64 units (128 e4m3 k, a part each), in
// K order: a box's weight rows, by TMA from the tensor map w_map, then its tokens, by cp.async
// (gemm_wgmma_layout.cuh's layout); each box's products start from zero and join the segment's
// sum in box order. A stage's products stay in flight through the next stage's barrier and
// copies (gemm_wgmma.cu's MMA_LAG): copies run STAGES - 2 stages ahead. Dynamic shared memory:
// the ring from the first 1024-byte boundary, then an mbarrier a stage
// (ops/gemm_fp8_stream.py smem_bytes).
//
// Defines: EPILOGUE (0 none, 1 SwiGLU, 2 xIELU), OUT_DTYPE, ROUND_BF16, WG (1 or 2), STAGES (3
// or more), BOXES (1, 2 or 4), NT (4 or 8), PDL (0/1).
#include "common.cuh"

#define SPLIT 0
#define TMA 1
#define W_FP8 1
#define RUNS 1
#define PARTS 1
#define TG 1
#ifndef BOXES
#define BOXES 1
#endif
#include "gemm_wgmma_block.cuh"  // out_t, MATS, BLOCK_ROWS, THREADS, TOKENS, W_STAGE, ..
static_assert(STAGES >= 3, "a stage filling, one in products, one ending");
static_assert(BOXES == 1 || BOXES == 2 || BOXES == 4, "BOXES: 1, 2 or 4 boxes a stage");

constexpr int AHEAD = STAGES - 2;  // stages of copies issued ahead
constexpr int XQ = TOKENS * 8 / THREADS;  // a thread's 16-byte chunks of a stage's tokens
static_assert(XQ >= 1 && XQ * THREADS == TOKENS * 8, "x chunks: whole rounds of the block");
constexpr int SUMS = MATS * NT * 4;  // a thread's sums (a Sums)
constexpr int STAGE_UNITS = 64 * BOXES;         // 2-byte units of K a stage
constexpr int SLOT_BYTES = BOXES * STAGE_BYTES;  // a ring slot: its boxes (STAGE_BYTES each)

#include "gemv_epilogue.cuh"  // scaled_sum, epilogue_value
#include "gemm_store.cuh"     // Sums, fold, store_sums
#include "tma.cuh"            // mbar_init, mbar_expect_bytes, mbar_wait, tma_load_2d
#include "wgmma.cuh"          // wgmma_commit, wgmma_wait_all, wgmma_stage_step

__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void store_release(int* p, int v) {
    asm volatile("st.release.gpu.global.s32 [%0], %1;" :: "l"(p), "r"(v) : "memory");
}

// A thread's sums in `partials` slot b: sum i of thread t at (b SUMS + i) THREADS + t.
__device__ __forceinline__ float* sums_slot(float* partials, int b) {
    return partials + (i64)b * SUMS * THREADS + threadIdx.x;
}

// f(sum, i) for each of a thread's sums, i its index among them.
template <typename F>
__device__ __forceinline__ void each_sum(Sums& sums, F f) {
#pragma unroll
    for (int m = 0; m < MATS; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) f(sums[m][j][e], (m * NT + j) * 4 + e);
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm_fp8_stream(out_t* __restrict__ out, const bf16_t* __restrict__ x,
                const void* __restrict__ w_map, int n, int K, int O, i64 x_stride,
                float alpha_p, float alpha_n, float beta, float eps,
                const float* __restrict__ w_scale, const float* __restrict__ x_scale,
                float* __restrict__ partials, int* __restrict__ flags) {
    extern __shared__ uint4 ring[];
    const int warp = threadIdx.x >> 5;
    const int per_tile = K / STAGE_UNITS;
    const i64 total = (i64)((O + BLOCK_ROWS - 1) / BLOCK_ROWS) * per_tile;
    auto begin = [&](int b) { return (int)(total * b / gridDim.x); };  // block b's first stage
    const int lo = begin(blockIdx.x), count = begin(blockIdx.x + 1) - lo;

    const u32 base = (smem_addr(ring) + WGMMA_ALIGN - 1) & ~(u32)(WGMMA_ALIGN - 1);
    auto bar = [&](int slot) { return base + (u32)(STAGES * SLOT_BYTES + 8 * slot); };
    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) mbar_init(bar(i), 1);
        mbar_init_fence();
    }
    __syncthreads();
    // This thread's chunks of a stage's tokens: copies q = threadIdx.x + i THREADS.
    const bf16_t* xsrc[XQ];
    u32 xdst[XQ];
#pragma unroll
    for (int i = 0; i < XQ; ++i) {
        const WgmmaChunk q = wgmma_chunk(threadIdx.x + i * THREADS);
        xsrc[i] = x + (i64)min(q.row, n - 1) * x_stride + 8 * q.chunk;  // past n: dropped
        xdst[i] = W_STAGE + wgmma_cell(q.row, q.chunk);
    }
    // The copies of the block's stage j into ring slot `slot`.
    auto issue = [&](int j, int slot, bool weights, bool xs) {
        if (j >= count) return;
        const int tile = (lo + j) / per_tile, k0 = (lo + j) % per_tile * STAGE_UNITS;
        const u32 dst = base + (u32)(slot * SLOT_BYTES);
        if (weights && threadIdx.x == 0) {  // one copy a box and matrix (rows past O: zeros)
            mbar_expect_bytes(bar(slot), (u32)(BOXES * W_STAGE));
            for (int b = 0; b < BOXES; ++b)
                for (int m = 0; m < MATS; ++m)
                    tma_load_2d(dst + (u32)(b * STAGE_BYTES + m * BLOCK_ROWS * 128), w_map,
                                k0 + 64 * b, m * O + tile * BLOCK_ROWS, bar(slot));
        }
#pragma unroll
        for (int b = 0; b < BOXES; ++b)
#pragma unroll
            for (int i = 0; i < XQ; ++i)
                if (xs)
                    cp_async_ca16(dst + (u32)(b * STAGE_BYTES) + xdst[i], xsrc[i] + k0 + 64 * b,
                                  16);
    };
#if PDL
    pdl_launch_dependents();
    for (int j = 0; j < AHEAD; ++j) issue(j, j, true, false);
    pdl_wait();  // x, the output, the partials and the flags are ours from here on
    for (int j = 0; j < AHEAD; ++j) issue(j, j, false, true);
    cp_async_commit();
    for (int j = 1; j < AHEAD; ++j) cp_async_commit();  // empty: AHEAD groups in all
#else
    for (int j = 0; j < AHEAD; ++j) {
        issue(j, j, true, true);
        cp_async_commit();
    }
#endif

    Sums acc[BOXES] = {}, run = {};  // a stage's products, a box each; the segment's sum
    int segment = lo;                // the segment's first stage
    // The segment that ends with stage `last` (of the whole order): its tile's outputs, or its
    // sums published. Every thread of the block calls it.
    auto finish = [&](int last) {
        const int tile = last / per_tile;
        if (segment % per_tile != 0) {  // a block's first segment, past its tile's start
            float* mine = sums_slot(partials, blockIdx.x);
            each_sum(run, [&](float& s, int i) { mine[i * THREADS] = s; });
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) store_release(flags + blockIdx.x, 1);
        } else {
            int after = blockIdx.x + 1;  // the blocks whose first segment ends this tile
            for (; after < (int)gridDim.x && begin(after) < (tile + 1) * per_tile; ++after) {
                if (threadIdx.x == 0)
                    while (load_acquire(flags + after) == 0) {}
                __syncthreads();
                const float* theirs = sums_slot(partials, after);
                each_sum(run, [&](float& s, int i) { s += __ldcg(theirs + i * THREADS); });
            }
            if (after > (int)blockIdx.x + 1) {
                __syncthreads();  // every thread has read them: lower the flags
                if (threadIdx.x == 0)
                    for (int b = blockIdx.x + 1; b < after; ++b) flags[b] = 0;
            }
            store_sums(run, run, out, w_scale, x_scale, n, O, tile * BLOCK_ROWS, 0, ring, alpha_p,
                       alpha_n, beta, eps);
        }
        each_sum(run, [](float& s, int) { s = 0.0f; });
        segment = last + 1;
    };
    const int a_row = 64 * (warp >> 2);  // this warpgroup's first weight row in a stage
    for (int j = 0, slot = 0, phase = 0; j < count; ++j) {
        cp_async_wait<AHEAD - 1>();  // stage j's tokens (this thread's) have landed
        fence_proxy_async();
        mbar_wait(bar(slot), phase);  // and its weights
        // Everyone's: j's slot is full, and the slot of stage j - 2 (whose products every warp
        // waited for in stage j - 1) may be refilled.
        __syncthreads();
        issue(j + AHEAD, slot + AHEAD < STAGES ? slot + AHEAD : slot + AHEAD - STAGES, true, true);
        cp_async_commit();
        if (j > 0) {  // stage j - 1's products have landed: its parts join the segment's sum
            wgmma_wait_all();
#pragma unroll
            for (int b = 0; b < BOXES; ++b) fold(run, acc[b]);
            if ((lo + j) % per_tile == 0) finish(lo + j - 1);  // stage j starts a tile
        }
#pragma unroll
        for (int b = 0; b < BOXES; ++b) {
            const u32 box = base + (u32)(slot * SLOT_BYTES + b * STAGE_BYTES);
            wgmma_stage_step(acc[b], box, 0, a_row, 0);
            wgmma_stage_step(acc[b], box, 1, a_row, 0);
        }
        wgmma_commit();
        slot = slot + 1 == STAGES ? 0 : slot + 1;
        phase ^= slot == 0;
    }
    cp_async_wait<0>();
    wgmma_wait_all();
#pragma unroll
    for (int b = 0; b < BOXES; ++b) fold(run, acc[b]);
    if (count > 0) finish(lo + count - 1);
}
