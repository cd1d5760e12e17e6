// Batched decode products of 9..64 token rows with bf16 weights: out (n, O) = x (n, K) @ W.T,
// float32 sums, out bf16 (rounded, as a bf16 F.linear) or float32 (the logits).
//
// Why a kernel beside gemv.cu: gemv.cu's warps split K inside a block, so every warp copies its
// own x chunks for each of its steps, and x comes from L2 for every block. With 4 or 8 token tiles
// those x bytes rival the weight's, and at 32 rows gemv.cu only ties cuBLAS (benchmarks/
// RESULTS.md, session 9). Here the warps split the rows instead:
//   * A block owns ROWS = 16 * TILES * WARPS output rows and one split of K, KC wide (grid y).
//     It copies x[0 .. TOKENS) x [k0, k0 + KC) into shared memory once (cp.async, zeros past n
//     and past K), so x costs TOKENS * KC * 2 bytes a block against ROWS * KC * 2 of weight (a
//     quarter with 32 tokens and 128 rows).
//   * Every warp streams its own 16 * TILES weight rows over the split through a private ring of
//     STAGES steps (cp.async, 16-byte copies, no registers held; gemv.cu's ring), and reads the x
//     fragments of each step from the shared copy.
//   * Fragments as gemv.cu's: lane (g = lane / 4, t = lane % 4) copies W[row g][k + 8t, + 8) and
//     W[row g + 8][same] of a 32-wide step; the x of token 8j + g at the same k gives the B
//     fragments (a dot product does not care in which order k is summed), so the first four bf16
//     pairs are one mma.m16n8k16 and the next four a second, for each token tile j < NT.
// Splits (gridDim.y > 1): every block writes its float32 sums to a scratch [split][n][O];
// the last block of a row block to arrive (common.cuh's last_split_to_arrive, a counter per row
// block) adds them in split order, rounds, writes out and re-arms its counter to 0, as
// gemv_rows.cu does (ops/common.py's GemvScratch holds both).
//
// Grid: (ceil(O / ROWS), splits); block: WARPS * 32 threads; dynamic shared memory:
// skinny_smem_bytes() in ops/linear.py: the x tile, TOKENS rows of XS bf16 (XS = KC + 32: the
// 64-byte pad puts the two token rows of a 16-byte load phase on different banks), then the
// rings [warp][stage][cell][lane] of 16-byte cells (cells: rows g and g + 8 of each tile).
// Programmatic dependent launch (PDL = 1): the weight prologue is issued before pdl_wait, x and
// every global write after it.
//
// Defines: NT (token tiles of 8: 2, 4 or 8; n <= 8 * NT), WARPS, TILES (16-row tiles a warp), KC
// (k of a split, a multiple of 32), STAGES (ring depth >= 2), OUT_DTYPE (bf16_t or float),
// ROUND_BF16 (round the sum to bf16 before writing), PDL (0/1). K: a multiple of 8, x_stride too.
#include "common.cuh"

#ifndef NT
#define NT 4
#endif
#ifndef WARPS
#define WARPS 8
#endif
#ifndef TILES
#define TILES 1
#endif
#ifndef KC
#define KC 1024
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef OUT_DTYPE
#define OUT_DTYPE bf16_t
#endif
#ifndef ROUND_BF16
#define ROUND_BF16 1
#endif
#ifndef PDL
#define PDL 0
#endif
typedef OUT_DTYPE out_t;

constexpr int TOKENS = 8 * NT;               // token slots
constexpr int XS = KC + 32;                  // x tile row stride, bf16 elements
constexpr int STEP_K = 32;                   // k of a warp step: 4 lanes x 8
constexpr int CELLS = 2 * TILES;             // 16-byte cells a lane copies per step
constexpr int ROWS = 16 * TILES * WARPS;     // output rows of a block
constexpr int X_CHUNKS = TOKENS * (KC / 8);  // 16-byte chunks of the x tile
static_assert(KC % STEP_K == 0 && STAGES >= 2 && (NT == 2 || NT == 4 || NT == 8), "defines");

__device__ __forceinline__ float rounded(float v) { return ROUND_BF16 ? round_to<bf16_t>(v) : v; }

extern "C" __global__ void __launch_bounds__(WARPS * 32)
gemm_skinny(out_t* __restrict__ out, const bf16_t* __restrict__ x, const bf16_t* __restrict__ w,
            int n, int K, int O, i64 x_stride, float* __restrict__ scratch,
            int* __restrict__ counters) {
    extern __shared__ uint4 smem[];
    bf16_t* xs = reinterpret_cast<bf16_t*>(smem);     // [TOKENS][XS]
    uint4* rings = smem + TOKENS * XS * 2 / 16;        // [WARPS][STAGES][CELLS][32]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int split = blockIdx.y, splits = gridDim.y;
    const int k0 = split * KC;
    const int k_len = min(KC, K - k0);  // > 0: splits = ceil(K / KC)
    const int steps = (k_len + STEP_K - 1) / STEP_K;
    const int block_row = blockIdx.x * ROWS;
    const int warp_row = block_row + warp * 16 * TILES;

    // Rows past O (the last block) read row O - 1 again; their sums are dropped.
    const bf16_t* wrow[CELLS];
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
        const int r0 = min(warp_row + 16 * j + g, O - 1);
        const int r1 = min(warp_row + 16 * j + g + 8, O - 1);
        wrow[2 * j] = w + (i64)r0 * K + k0 + 8 * t;
        wrow[2 * j + 1] = w + (i64)r1 * K + k0 + 8 * t;
    }
    uint4* my_ring = rings + warp * STAGES * CELLS * 32 + lane;
    const u32 ring_addr = smem_addr(my_ring);

    // This lane's weight chunks of step i into ring stage i % STAGES (zeros past the split's
    // end); nothing for a step past the last (its group stays empty).
    auto issue_w = [&](int i) {
        if (i >= steps) return;
        const int k = i * STEP_K;
        const bool valid = k + 8 * t < k_len;
        const u32 stage = ring_addr + (u32)((i % STAGES) * CELLS * 32 * 16);
#pragma unroll
        for (int c = 0; c < CELLS; ++c)
            cp_async_cg16(stage + c * 32 * 16, wrow[c] + (valid ? k : 0), valid ? 16 : 0);
    };
    // The block's x tile: chunk c is token c / (KC / 8), k 8 * (c % (KC / 8)).
    auto issue_x = [&]() {
        for (int c = threadIdx.x; c < X_CHUNKS; c += WARPS * 32) {
            const int tok = c / (KC / 8), kk = 8 * (c % (KC / 8));
            const bool valid = tok < n && kk < k_len;
            const bf16_t* src = x + (valid ? (i64)tok * x_stride + k0 + kk : 0);
            cp_async_cg16(smem_addr(xs + tok * XS + kk), src, valid ? 16 : 0);
        }
    };

    // Prologue: one commit group (weight stages 0 .. STAGES - 2, then the x tile), padded with
    // empty groups so that the loop's "group i has landed" is a fixed count.
#if PDL
    pdl_launch_dependents();
#endif
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) issue_w(i);
#if PDL
    pdl_wait();  // x, the output, the scratch and the counters belong to the previous kernels
#endif
    issue_x();
    cp_async_commit();
#pragma unroll
    for (int i = 1; i < STAGES - 1; ++i) cp_async_commit();

    float acc[TILES][NT][4];
#pragma unroll
    for (int m = 0; m < TILES; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
            acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;

    for (int i = 0; i < steps; ++i) {
        issue_w(i + STAGES - 1);  // refills the stage read in step i - 1 (this lane's own cells)
        cp_async_commit();
        cp_async_wait<STAGES - 1>();  // step i's group has landed (this thread's copies)
        if (i == 0) __syncthreads();   // and every thread's copies of the x tile
        const uint4* stage = my_ring + (i % STAGES) * CELLS * 32;
        const int kx = i * STEP_K + 8 * t;
        uint4 xv[NT];
#pragma unroll
        for (int j = 0; j < NT; ++j)
            xv[j] = *reinterpret_cast<const uint4*>(xs + (8 * j + g) * XS + kx);
#pragma unroll
        for (int m = 0; m < TILES; ++m) {
            const uint4 wa = stage[(2 * m) * 32], wb = stage[(2 * m + 1) * 32];
            const u32* pa = reinterpret_cast<const u32*>(&wa);
            const u32* pb = reinterpret_cast<const u32*>(&wb);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const u32* px = reinterpret_cast<const u32*>(&xv[j]);
                mma_bf16_16816(acc[m][j], pa[0], pb[0], pa[1], pb[1], px[0], px[1]);
                mma_bf16_16816(acc[m][j], pa[2], pb[2], pa[3], pb[3], px[2], px[3]);
            }
        }
    }
    cp_async_wait<0>();

    // acc[m][j][0..1]: row warp_row + 16 m + g, tokens 8 j + 2t and + 1; [2..3]: row + 8.
    auto each_sum = [&](auto&& use) {
#pragma unroll
        for (int m = 0; m < TILES; ++m)
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int tok = 8 * j + 2 * t, row = warp_row + 16 * m + g;
                use(tok, row, acc[m][j][0]);
                use(tok + 1, row, acc[m][j][1]);
                use(tok, row + 8, acc[m][j][2]);
                use(tok + 1, row + 8, acc[m][j][3]);
            }
    };
    if (splits == 1) {
        each_sum([&](int tok, int row, float v) {
            if (tok < n && row < O) out[(i64)tok * O + row] = from_float<out_t>(rounded(v));
        });
        return;
    }

    // --- split-K: partials to the scratch [split][n][O]; the last block sums them -------------
    each_sum([&](int tok, int row, float v) {
        if (tok < n && row < O) scratch[((i64)split * n + tok) * O + row] = v;
    });
    if (!last_split_to_arrive(counters + blockIdx.x, splits)) return;
    for (int idx = threadIdx.x; idx < n * ROWS; idx += WARPS * 32) {
        const int tok = idx / ROWS, row = block_row + idx % ROWS;
        if (row >= O) continue;
        const float* p = scratch + (i64)tok * O + row;
        float sum = __ldcg(p);  // L2: another SM wrote it
        for (int sp = 1; sp < splits; ++sp) sum += __ldcg(p + (i64)sp * n * O);
        out[(i64)tok * O + row] = from_float<out_t>(rounded(sum));
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // re-armed for the next launch / graph replay
}
