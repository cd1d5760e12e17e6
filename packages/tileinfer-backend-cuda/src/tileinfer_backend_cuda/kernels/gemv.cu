// Decode GEMV: out (n, O) = x (n, K) @ W.T for n <= 8 * NT tokens, W (O, K) bf16 or int8 with
// a float32 scale per output row, float32 accumulation, optional fused SwiGLU / xIELU epilogue;
// or (W_FP8) the FP8 product of tileinfer/backend/fp8.py: W e4m3 with row scales, x the e4m3
// values of the input (fp8_quant.cu) with one float32 scale per token row (x_scale).
//
// At decode the kernel is a stream over W that must keep enough bytes in flight to reach the
// memory bandwidth (Little's law: some 40 KB per SM). Register loads do not do that reliably
// (ptxas schedules each load next to its first use), so every warp streams its share of W
// through a private ring of STAGES slots in shared memory with cp.async (16-byte copies,
// STAGES - 1 steps of 1 KB ahead), and reads each slot back once its copy group has landed.
// WARPS warps of a block split K between them (an in-block split-K, reduced through shared
// memory in a fixed order), so narrow outputs still put many loads in flight.
//
// The multiply-add uses the tensor cores (mma.m16n8k16, bf16 in, float32 out) with the 8 token
// rows as the n = 8 side, which costs nothing at n < 8 and keeps the CUDA cores free for the
// INT8 -> bf16 conversion. NT token tiles of 8 (a batched step of up to 8 * NT rows) reuse each
// weight fragment for NT mma's, so the weight is still read once: a step of 9..64 rows streams
// it as a step of 8 does, plus NT x chunks a lane and step. A dot product does not care in
// which order k is summed, so the fragments come straight from the 16-byte chunks: lane
// (g = lane / 4, t = lane % 4) copies W[row g][k + 8t .. k + 8t + 8), W[row g + 8][same] and
// x[token g][same]; the first four weight pairs of each row are the A fragment of one mma and
// the x pairs at the same k its B fragment, the next four pairs the second mma (layouts:
// mma_bf16_16816 in common.cuh; NK_PRODUCTS, gemv_nk.cuh: 16 neighbouring k a mma). With
// INT8 weights a lane takes 16 int8 per row (64 k per warp step), converted exactly to bf16 in
// registers; the per-row scale multiplies the float32 sum. With FP8 a lane takes 16 e4m3 of each
// weight row and 16 e4m3 of x, both converted exactly to f16 (cvt, two values an instruction)
// for f16 mma's; the sum is scaled by x_scale[token], then by the row's scale.
//
// TILES tiles of 16 output rows per warp share each step's x chunks (from L2 for every block:
// with 8 tokens, x is half a tile's weight bytes).
//
// REGS > 0 streams the weight through registers instead of the ring, as gemv_rows.cu does: the
// weight chunks of round j + 1 (REGS steps) are requested (ld.global.nc) before the mma's of
// round j, from two register buffers; x is read when its mma's run (__ldg: L1 hits after the
// first warp). Same fragments, same k order per warp.
//
// X_REUSE = 1 (the ring only) reads a step's x chunks from the ring once for all of the warp's
// tiles (at 64 token rows x is four times a tile's weight bytes), holding their fragments.
//
// GROUPS > 1 puts GROUPS groups of WARPS warps in a block, each group on its own 16 * TILES
// rows: warp w of every group walks the same K steps at the same pace, so each step's x chunks
// come from L2 once per block and from L1 for the other groups. Groups change which rows share
// a block, not the order of any sum.
//
// The block's sums (WARPS partial sums of every row and token) meet in shared memory, the ring's
// once every copy has landed (gemv_smem_bytes in ops/linear.py: the larger of the two). They are
// added in RUNS runs of WARPS / RUNS warps: each run's sum from zero in warp order, then the
// runs' sums in order, as gemm_invariant.cu adds them where it splits a weight by run.
//
// Grid: ceil(O / (16 * TILES * GROUPS)) blocks of 16 * TILES * GROUPS output rows (SwiGLU: gate
// rows j and up rows O + j in one block); block: GROUPS * WARPS * 32 threads.
//
// Programmatic dependent launch (PDL = 1): the prologue issues the first STAGES - 1 steps'
// weight copies, waits for the previous grid (pdl_wait), then issues their x copies, all one
// commit group (padded with empty groups, so the steady state's counting is unchanged). Every
// output write follows pdl_wait.
//
// Defines: W_INT8 (0/1), W_E4M3 (0/1: the one-byte weights are e4m3, common.cuh), W_FP8 (0/1;
// sm_89 and newer), INT8_LOAD (16 or 8 bytes per int8 chunk; 8 when K % 16 != 0), EPILOGUE
// (0 none, 1 SwiGLU, 2 xIELU), OUT_DTYPE (bf16_t or float),
// ROUND_BF16 (round the sum to bf16 before writing: what a bf16 F.linear does), WARPS, STAGES,
// TILES, NT, REGS (0: the ring; else steps per register round, 16-byte weight chunks only),
// GROUPS (row groups of a block), X_REUSE (0/1), RUNS (runs of warps in the final sum),
// BLOCKED_PARTS (0/1: the warps' K steps interleaved or contiguous, gemv_parts.cuh), PART_CHUNK
// (interleaved steps a chunk), NK_PRODUCTS (0/1, gemv_nk.cuh), PDL (0/1).
#include "common.cuh"

#ifndef W_INT8
#define W_INT8 0
#endif
#ifndef W_FP8
#define W_FP8 0
#endif
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
#ifndef WARPS
#define WARPS 8
#endif
#ifndef STAGES
#define STAGES 8
#endif
#ifndef TILES
#define TILES 1
#endif
#ifndef NT
#define NT 1
#endif
#ifndef REGS
#define REGS 0
#endif
#ifndef PDL
#define PDL 0
#endif
#ifndef GROUPS
#define GROUPS 1
#endif
#ifndef X_REUSE
#define X_REUSE 0
#endif
#ifndef RUNS
#define RUNS 1
#endif
typedef OUT_DTYPE out_t;

constexpr int MATS = EPILOGUE == 1 ? 2 : 1;  // weight matrices: gate (and up)
constexpr int WT = MATS * TILES;             // 16-row weight tiles a warp streams
constexpr int GROUP_ROWS = 16 * TILES;       // output rows of a group of WARPS warps
constexpr int THREADS = GROUPS * WARPS * 32;
constexpr int TOKENS = 8 * NT;               // token slots
// k covered by one lane's chunk, and by one warp step (4 lanes side by side).
constexpr int LANE_K = W_FP8 ? 16 : W_INT8 ? INT8_LOAD : 8;
constexpr int STEP_K = 4 * LANE_K;
constexpr int W_BYTES = W_INT8 ? INT8_LOAD : 16;  // bytes of one lane's weight chunk
constexpr int XVECS = W_FP8 ? 1 : LANE_K / 8;     // 16-byte chunks of x per lane and step
// Ring slot layout: [warp][stage][part][lane] 16-byte cells; parts: 2 weight rows per tile
// (tile i = mat * TILES + j: rows 16 j + g and 16 j + g + 8 of matrix mat), then the x chunks
// of each token tile (tokens 8 j + g).
#if !REGS
constexpr int PARTS = 2 * WT + XVECS * NT;
#endif
static_assert(REGS == 0 || W_BYTES == 16, "REGS: 16-byte weight chunks only");

#if W_FP8
#include "fp8.cuh"
typedef unsigned char w_t;
typedef unsigned char x_t;  // e4m3
#elif W_INT8
typedef signed char w_t;
typedef bf16_t x_t;
#else
typedef bf16_t w_t;
typedef bf16_t x_t;
#endif

#include "gemv_frag.cuh"  // copy_w, Frag, to_frag, step_mma
#include "gemv_nk.cuh"    // NK_PRODUCTS: nk_cell, nk_a, nk_b, nk_mma
#include "gemv_epilogue.cuh"  // scaled_sum, epilogue_value
#include "gemv_parts.cuh"     // part_steps, part_step (BLOCKED_PARTS, PART_CHUNK)
static_assert(WARPS % RUNS == 0, "RUNS: runs of whole warps");
static_assert(!(REGS && NK_PRODUCTS), "NK_PRODUCTS: the ring only");

extern "C" __global__ void __launch_bounds__(THREADS)
gemv(out_t* __restrict__ out, const x_t* __restrict__ x, const w_t* __restrict__ w,
     const float* __restrict__ w_scale, int n, int K, int O, i64 x_stride, float alpha_p,
     float alpha_n, float beta, float eps, const float* __restrict__ x_scale) {
    extern __shared__ uint4 ring[];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;  // wid: the warp in the block
    const int group = wid / WARPS, warp = wid % WARPS;              // warp: its place in K
    const int g = lane >> 2, t = lane & 3;
    const int block_base = blockIdx.x * GROUPS * GROUP_ROWS;
    const int row_base = block_base + group * GROUP_ROWS;
    // Token slots past n read token n - 1 again; their sums are dropped.
    const x_t* xrow[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) xrow[j] = x + (i64)min(8 * j + g, n - 1) * x_stride + t * LANE_K;
    const w_t* wrow[WT][2];
#pragma unroll
    for (int m = 0; m < MATS; ++m) {
#pragma unroll
        for (int j = 0; j < TILES; ++j) {
            // Rows past O (the last block) read row O - 1 again; their sums are dropped.
            const int r0 = min(row_base + 16 * j + g, O - 1);
            const int r1 = min(row_base + 16 * j + g + 8, O - 1);
            wrow[m * TILES + j][0] = w + ((i64)m * O + r0) * K + t * LANE_K;
            wrow[m * TILES + j][1] = w + ((i64)m * O + r1) * K + t * LANE_K;
        }
    }
    // Warp `warp` takes the steps of part `warp` (gemv_parts.cuh: warp, warp + WARPS, ..., in
    // chunks of PART_CHUNK, or a contiguous range with BLOCKED_PARTS), step s k [s, s + 1) STEP_K.
    const int steps = (K + STEP_K - 1) / STEP_K;
    const int my_steps = part_steps(warp, steps, WARPS);
    float acc[WT][NT][4];
#pragma unroll
    for (int m = 0; m < WT; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[m][j][0] = acc[m][j][1] = acc[m][j][2] = acc[m][j][3] = 0.0f;
    // The k of this warp's i-th step, and whether this lane's chunk there holds data: the step is
    // one of the warp's and the chunk starts before K (K is a multiple of LANE_K).
    auto step_k = [&](int i) { return part_step(warp, i, steps, WARPS) * STEP_K; };
    auto in_range = [&](int i, int k) { return i < my_steps && k + t * LANE_K < K; };
#if REGS
    // Register stream: round j holds this warp's steps j * REGS .. j * REGS + REGS - 1; a chunk
    // past K (or past the warp's steps) is zeros, its x too (a zero weight times any x is 0 only
    // when x is finite).
    auto load_round = [&](uint4 (&wa)[REGS][WT], uint4 (&wb)[REGS][WT],
                          int j) {
#pragma unroll
        for (int u = 0; u < REGS; ++u) {
            const int i = j * REGS + u, k = step_k(i);
            const bool valid = in_range(i, k);
#pragma unroll
            for (int m = 0; m < WT; ++m) {
                wa[u][m] = valid ? load_stream(wrow[m][0] + k) : make_uint4(0, 0, 0, 0);
                wb[u][m] = valid ? load_stream(wrow[m][1] + k) : make_uint4(0, 0, 0, 0);
            }
        }
    };
    auto math_round = [&](const uint4 (&wa)[REGS][WT],
                          const uint4 (&wb)[REGS][WT], int j) {
        uint4 xv[REGS][NT][XVECS];  // the round's x chunks, all requested first
#pragma unroll
        for (int u = 0; u < REGS; ++u) {
            const int i = j * REGS + u, k = step_k(i);
            const bool valid = in_range(i, k);
#pragma unroll
            for (int jt = 0; jt < NT; ++jt)
#pragma unroll
                for (int v = 0; v < XVECS; ++v)
                    xv[u][jt][v] = valid ? __ldg(reinterpret_cast<const uint4*>(xrow[jt] + k + 8 * v))
                                         : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < REGS; ++u)
#pragma unroll
            for (int m = 0; m < WT; ++m) {
                Frag f;
                to_frag(f, wa[u][m], wb[u][m]);
#pragma unroll
                for (int jt = 0; jt < NT; ++jt) step_mma(acc[m][jt], f, xv[u][jt]);
            }
    };
    const int rounds = (my_steps + REGS - 1) / REGS;
    uint4 wa0[REGS][WT], wb0[REGS][WT];
    uint4 wa1[REGS][WT], wb1[REGS][WT];
#if PDL
    pdl_launch_dependents();
#endif
    load_round(wa0, wb0, 0);
#if PDL
    pdl_wait();  // x (and the output buffer) belong to the previous kernels from here on
#endif
    for (int j = 0; j < rounds; j += 2) {
        load_round(wa1, wb1, j + 1);
        math_round(wa0, wb0, j);
        if (j + 1 >= rounds) break;
        load_round(wa0, wb0, j + 2);
        math_round(wa1, wb1, j + 1);
    }
    __syncthreads();  // the ring's shared memory holds the partial sums from here on
#else
    const int my_cell = NK_PRODUCTS ? nk_cell(g, t) : lane;  // this lane's cell of a part
    const NkLane nk = nk_lane(lane);                          // its ldmatrix rows (NK only)
    uint4* my_ring = ring + (i64)wid * STAGES * PARTS * 32 + my_cell;
    const u32 my_ring_addr = smem_addr(my_ring);

    // Copy this lane's chunks of its i-th step into ring stage i % STAGES (zeros past the end),
    // one commit group a call ("group i done" is a fixed count); issue_w / issue_x: the weight /
    // x half of step i (PDL's prologue splits them).
    auto issue_w = [&](int i) {
        const int k = step_k(i);
        const bool valid = in_range(i, k);
        const int kk = valid ? k : 0;
        const u32 stage = my_ring_addr + (u32)((i % STAGES) * PARTS * 32 * 16);
#pragma unroll
        for (int m = 0; m < WT; ++m) {
            copy_w(stage + (2 * m) * 32 * 16, wrow[m][0] + kk, valid);
            copy_w(stage + (2 * m + 1) * 32 * 16, wrow[m][1] + kk, valid);
        }
    };
    auto issue_x = [&](int i) {
        const int k = step_k(i);
        const bool valid = in_range(i, k);
        const int kk = valid ? k : 0;
        const u32 stage = my_ring_addr + (u32)((i % STAGES) * PARTS * 32 * 16);
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int v = 0; v < XVECS; ++v)
                cp_async_ca16(stage + (2 * WT + j * XVECS + v) * 32 * 16, xrow[j] + kk + 8 * v,
                              valid ? 16 : 0);
    };
    auto issue = [&](int i) {
        issue_w(i);
        issue_x(i);
        cp_async_commit();
    };

#if PDL
    pdl_launch_dependents();
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) issue_w(i);
    pdl_wait();  // x (and the output buffer) belong to the previous kernels from here on
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) issue_x(i);
    cp_async_commit();
#pragma unroll
    for (int i = 1; i < STAGES - 1; ++i) cp_async_commit();  // empty: STAGES - 1 groups in all
#else
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) issue(i);
#endif
    for (int i = 0; i < my_steps; ++i) {
        if (NK_PRODUCTS) __syncwarp();  // every lane's ldmatrix reads of step i - 1 are done
        issue(i + STAGES - 1);          // refills the stage read in step i - 1
        cp_async_wait<STAGES - 1>();    // step i's group has landed (this lane's own copies)
        const uint4* stage = my_ring + (i % STAGES) * PARTS * 32;
#if NK_PRODUCTS
        __syncwarp();  // every lane's copies of step i have landed: ldmatrix reads them all
        const u32 parts = smem_addr(ring + ((i64)wid * STAGES + i % STAGES) * PARTS * 32);
        u32 a[WT][2][4];
#pragma unroll
        for (int m = 0; m < WT; ++m) nk_a(a[m], parts + 1024 * m, nk);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            u32 b[4];
            nk_b(b, parts + (2 * WT + j) * 512, nk);
#pragma unroll
            for (int m = 0; m < WT; ++m) nk_mma(acc[m][j], a[m], b);
        }
#elif X_REUSE
        // Every tile's fragments first, then each token tile's x chunks read once for all of
        // them: the same mma's on every accumulator, in the same k order.
        Frag f[WT];
#pragma unroll
        for (int m = 0; m < WT; ++m) to_frag(f[m], stage[(2 * m) * 32], stage[(2 * m + 1) * 32]);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            uint4 xv[XVECS];
#pragma unroll
            for (int v = 0; v < XVECS; ++v) xv[v] = stage[(2 * WT + j * XVECS + v) * 32];
#pragma unroll
            for (int m = 0; m < WT; ++m) step_mma(acc[m][j], f[m], xv);
        }
#else
#pragma unroll
        for (int m = 0; m < WT; ++m) {
            Frag f;
            to_frag(f, stage[(2 * m) * 32], stage[(2 * m + 1) * 32]);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                uint4 xv[XVECS];
#pragma unroll
                for (int v = 0; v < XVECS; ++v) xv[v] = stage[(2 * WT + j * XVECS + v) * 32];
                step_mma(acc[m][j], f, xv);
            }
        }
#endif
    }
    cp_async_wait<0>();
    __syncthreads();  // every copy has landed: the ring holds the partial sums from here on
#endif

    // partial[group][warp][tile][row][token], rows padded to TOKENS + 1 floats (no bank
    // conflicts).
    constexpr int PAD = TOKENS + 1;
    float* partial = reinterpret_cast<float*>(ring);
    auto at = [&](int gi, int wi, int m, int r, int tok) -> float& {
        return partial[(((gi * WARPS + wi) * WT + m) * 16 + r) * PAD + tok];
    };

    // Accumulator layout: acc[m][j][0..1] = row g, tokens 8 j + 2t, + 1; acc[m][j][2..3] = row
    // g + 8, the same tokens.
#pragma unroll
    for (int m = 0; m < WT; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const int tok = 8 * j + 2 * t;
            at(group, warp, m, g, tok) = acc[m][j][0];
            at(group, warp, m, g, tok + 1) = acc[m][j][1];
            at(group, warp, m, g + 8, tok) = acc[m][j][2];
            at(group, warp, m, g + 8, tok + 1) = acc[m][j][3];
        }
    __syncthreads();

    // Thread idx -> (token idx / block rows, row idx % block rows): consecutive threads write
    // consecutive rows.
    constexpr int BLOCK_ROWS = GROUPS * GROUP_ROWS;
    for (int idx = threadIdx.x; idx < BLOCK_ROWS * TOKENS; idx += THREADS) {
        const int tok = idx / BLOCK_ROWS, row = block_base + idx % BLOCK_ROWS;
        const int gi = idx % BLOCK_ROWS / GROUP_ROWS, r_in_group = idx % GROUP_ROWS;
        if (tok >= n || row >= O) continue;
        float v[MATS];
#pragma unroll
        for (int m = 0; m < MATS; ++m) {
            // Runs of WARPS / RUNS warps: each run's sum from zero in warp order, then the runs'
            // sums in run order (RUNS = 1: the warps' sums in warp order).
            float s = 0.0f;
#pragma unroll
            for (int q = 0; q < RUNS; ++q) {
                float r = 0.0f;
#pragma unroll
                for (int wi = q * (WARPS / RUNS); wi < (q + 1) * (WARPS / RUNS); ++wi)
                    r += at(gi, wi, m * TILES + r_in_group / 16, r_in_group % 16, tok);
                s += r;
            }
            v[m] = scaled_sum(s, m, tok, row, O, w_scale, x_scale);
        }
        const float y = epilogue_value(v, alpha_p, alpha_n, beta, eps);
        out[(i64)tok * O + row] = from_float<out_t>(y);
    }
}
