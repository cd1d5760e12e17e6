// gemm_wgmma.cu's sums with a warp of their own for the copies (warp specialization), for the
// unsplit launches of many rows (a prefill's): the same sums in the same order, so a row gets
// gemv.cu's bits. In gemm_wgmma.cu every warp issues its share of a stage's copies, waits for
// them and meets the others at a barrier before its products, one dependent instruction after
// another; here one thread of the block's last warp (the producer) issues every copy, by TMA,
// and the warpgroups (the consumers) only multiply, the two meeting on mbarriers:
//
// - full[slot]: the stage in the slot has landed: its weight rows (a copy a matrix, w_map) and
//   its tokens (one copy, x_map), their bytes expected by the producer's one arrival;
// - empty[slot]: the consumers are done with the slot's stage: one arrival a consumer warp
//   once its products of that stage have completed (a stage's products stay in flight until
//   the next stage's are issued, wgmma_wait_one).
//
// The producer refills a slot once empty[slot] completes, STAGES stages ahead of the consumers
// at most. The order, layout, operands, token groups and end are gemm_wgmma.cu's (its header);
// a block's consumers are WG x TG warpgroups (THREADS threads), the producer warp THREADS ..
// THREADS + 31. Unsplit only (the producer takes no part in a split's tail). x_map: the step's
// activations [n, K] in boxes of TOKENS rows x 64 k (ops/tensor_map.py's token_map; rows past n
// come in as zeros), by value; x and x_stride are not read (the arguments are gemm_wgmma.cu's).
// Dynamic shared memory: gemm_wgmma.smem_bytes (the ring from the first 1024-byte boundary,
// then 2 STAGES mbarriers).
//
// Defines: EPILOGUE (0 none, 1 SwiGLU, 2 xIELU), OUT_DTYPE, ROUND_BF16, PARTS, RUNS, WG (1 or 2),
// STAGES, NT (4 or 8), TG (1, 2 or 4), PDL (0/1).
#include "common.cuh"

#define SPLIT 0
#include "gemm_wgmma_block.cuh"  // defaults, out_t, MATS, BLOCK_ROWS, THREADS, TOKENS, W_STAGE, ..
static_assert(!W_FP8, "e4m3 products: gemm_wgmma.cu");
static_assert(PER_RUN >= 1, "whole runs");  // (gemm_store.cuh reads it with several runs)

constexpr int CONSUMER_WARPS = THREADS / 32, PRODUCER = CONSUMER_WARPS;  // the producer's warp
constexpr int BAR_OFFSET = STAGES * STAGE_BYTES;  // full[STAGES], then empty[STAGES]

#include "gemv_epilogue.cuh"      // scaled_sum, epilogue_value
#include "gemm_store.cuh"         // Sums, close_parts, store_sums
#include "tma.cuh"                // mbar_*, tma_load_2d, TensorMapArg
#include "wgmma.cuh"              // wgmma_commit, wgmma_wait_*, wgmma_stage_step

__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS + 32)
gemm_wgmma_ws(out_t* __restrict__ out, const bf16_t* __restrict__ x,
              const bf16_t* __restrict__ w, const void* __restrict__ w_map, int n, int K, int O,
              i64 x_stride, float alpha_p, float alpha_n, float beta, float eps,
              const __grid_constant__ TensorMapArg x_map) {
    extern __shared__ uint4 ring[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int block_base = blockIdx.y * BLOCK_ROWS;
    out += (i64)blockIdx.x * TOKENS * O;
    n = min(n - (int)blockIdx.x * TOKENS, TOKENS);
    // The block's steps: all parts', contiguous, two a stage.
    const WgmmaSteps walk = wgmma_steps(0, PARTS, K / 32, PARTS);
    const int first = walk.first, last = walk.last, per = walk.per;
    const int stage_count = (last - first + 1) / 2;

    const u32 base = (smem_addr(ring) + WGMMA_ALIGN - 1) & ~(u32)(WGMMA_ALIGN - 1);
    auto full = [&](int slot) { return base + (u32)(BAR_OFFSET + 8 * slot); };
    auto empty = [&](int slot) { return base + (u32)(BAR_OFFSET + 8 * (STAGES + slot)); };
    if (threadIdx.x == 0) {
        for (int i = 0; i < STAGES; ++i) {
            mbar_init(full(i), 1);
            mbar_init(empty(i), CONSUMER_WARPS);
        }
        mbar_init_fence();
    }
    __syncthreads();
#if PDL
    pdl_launch_dependents();
#endif

    if (warp == PRODUCER) {
        if (lane != 0) return;
        const int token0 = blockIdx.x * TOKENS;
        for (int st = 0, slot = 0, phase = 0; st < stage_count; ++st) {
            if (st >= STAGES) mbar_wait(empty(slot), phase ^ 1);  // its last stage is done
            const int k0 = (first + 2 * st) * 32;
            const u32 dst = base + (u32)(slot * STAGE_BYTES);
            mbar_expect_bytes(full(slot), (u32)STAGE_BYTES);
            for (int m = 0; m < MATS; ++m)
                tma_load_2d(dst + (u32)(m * BLOCK_ROWS * 128), w_map, k0, m * O + block_base,
                            full(slot));
#if PDL
            if (st == 0) pdl_wait();  // x belongs to the previous kernels until here
#endif
            tma_load_2d(dst + (u32)W_STAGE, &x_map, k0, token0, full(slot));
            slot = slot + 1 == STAGES ? 0 : slot + 1;
            phase ^= slot == 0;
        }
        return;
    }

#if PDL
    pdl_wait();  // the output belongs to the previous kernels until here
#endif
    Sums acc = {}, run = {}, sum = {};  // a part's, its run's, the block's (close_parts)
    int next_part = 0;  // the first part whose sum has not been added
    auto close = [&](int upto) {  // the parts before `upto`, once their products have landed
        if (next_part >= upto) return;
        wgmma_commit();
        wgmma_wait_all();
        close_parts(next_part, upto, acc, run, sum);
    };
    const int a_row = 64 * ((warp >> 2) % WG);  // this warpgroup's first weight row in a stage
    const int b_row = 8 * NT * ((warp >> 2) / WG);  // and its first token
    for (int st = 0, slot = 0, phase = 0, before = STAGES - 1; st < stage_count; ++st) {
        mbar_wait(full(slot), phase);
        const u32 stage = base + (u32)(slot * STAGE_BYTES);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int s = first + 2 * st + u;
            if (s >= last) break;
            close(s / per);  // the parts that ended before this step
            wgmma_stage_step(acc, stage, u, a_row, b_row);
        }
        wgmma_commit();
        wgmma_wait_one();  // stage st - 1's products are done; st's run on
        if (st > 0 && lane == 0) mbar_arrive(empty(before));
        before = slot;
        slot = slot + 1 == STAGES ? 0 : slot + 1;
        phase ^= slot == 0;
    }
    wgmma_wait_all();
    close(PARTS);
    store_sums(run, sum, out, nullptr, nullptr, n, O, block_base, 0, ring, alpha_p, alpha_n,
               beta, eps);
}
