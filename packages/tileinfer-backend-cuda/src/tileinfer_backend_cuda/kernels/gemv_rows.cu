// Row-streaming decode GEMV: out (n, O) = x (n, K) @ W.T for n <= 8 tokens, W (O, K) bf16 or
// int8 with a float32 scale per output row, float32 accumulation, optional fused SwiGLU / xIELU
// epilogue. The same contract as gemv.cu's `gemv` (plus a split-K scratch), another design.
//
// At decode the weight is read once per token: the kernel is a stream over W, and what decides
// its speed is how many bytes each SM keeps in flight (Little's law: ~36 GB/s per SM x ~1 us of
// latency under load, some 32-64 KB) and how well the requests hit DRAM pages. Here a warp owns
// ROWS consecutive output rows (gate and up rows for SwiGLU) and streams them along K: per step
// lane l loads the 16 bytes at k = step * STEP_K + l * LANE_K of each of its rows, so a warp reads
// 512 contiguous bytes of every row per step (LANE_K = 8 bf16 or 16 int8 weights; STEP_K = 32 *
// LANE_K). The loads go straight to registers (ld.global.nc, not allocated in L1): a warp works
// in rounds of UNROLL steps, and the weights of round j + 1 are requested before the
// multiply-adds of round j (two register buffers, the loop unrolled by two so none is copied), so
// between UNROLL and 2 x UNROLL steps, ROWS x 512 bytes each, are in flight per warp.
//
// Math: lane l accumulates, for each token t and row r, acc[t][r] += W[r][k] * x[t][k] over its
// k (fmaf, element by element, its steps in increasing k); int8 weights are converted exactly to
// float by the magic-number trick (int8x4_to_float4 in common.cuh), the row's scale multiplies
// the final sum. The x chunks of a step (bf16, the same k, every token) are loaded once and used
// for all rows: x is tiny and stays in L1 / L2. At the end:
//   sum over the warp: a butterfly of __shfl_xor_sync (16, 8, 4, 2, 1); IEEE addition is
//     commutative, so every lane ends with the same bits;
//   sum over the WARPS warps of the block (an in-block split of K: warp w takes the steps
//     w, w + WARPS, ...; the block reads WARPS x 512 contiguous bytes of a row per step), in warp
//     order through shared memory;
//   sum over the grid's splits of K (gridDim.y > 1, for narrow outputs, where O / ROWS blocks
//     are too few to fill the GPU): every block writes its float32 sums to a scratch
//     [split][mat][token][O]; the last block of a row tile to arrive (common.cuh's
//     last_split_to_arrive, a counter per tile) adds the splits in split order, applies the
//     epilogue and re-arms its counter to 0 (no memset before a launch, and a CUDA graph
//     replays correctly).
//     ops/common.py allocates the scratch and the counters once per device (reserve_scratch).
// Row invariance: a (token, row) sum depends only on K, WARPS and the split of K, never on n or
// on the other tokens, so a row of an 8-token verify step equals the same row of a 1-token step
// bit for bit. TOKENS (the token slots compiled in, registers for acc) may differ between the two
// launches, and so may ROWS and UNROLL: none of them changes any sum's order.
//
// Epilogue (as gemv.cu and transformers): none: the sum, rounded to bf16 when ROUND_BF16 (a bf16
// F.linear); SwiGLU: gate and up rounded to bf16, act = bf16(silu(gate)), out = act * up;
// xIELU: xielu(bf16(sum)) in float32. The result is written as OUT_DTYPE.
//
// Grid: (ceil(O / ROWS), splits); block: WARPS x 32 threads; no dynamic shared memory.
// Arguments: gemv.cu's, then k_split (the K range of a split, whole warp steps), the scratch
// (splits x MATS x 8 x O floats) and the counters (one per row tile, zero); the last two are
// only touched when splits > 1.
// K: a multiple of LANE_K (rows start 16-byte aligned); a split's range that is no multiple of
// UNROLL x WARPS x STEP_K ends in a masked round (no loads, no math past its end).
//
// Programmatic dependent launch (PDL = 1): the weights depend on no earlier kernel, x does. The
// first round's weight loads are issued, then the kernel waits for the previous grid
// (pdl_wait), then loads x; every global write (output, scratch, counters) follows pdl_wait.
//
// Defines: W_INT8 (0/1), W_E4M3 (0/1: the one-byte weights are e4m3, common.cuh),
// EPILOGUE (0 none, 1 SwiGLU, 2 xIELU), OUT_DTYPE (bf16_t or float),
// ROUND_BF16, ROWS (output rows per block), UNROLL (steps per round, 1..4), WARPS (warps
// splitting K in a block), TOKENS (token slots, n <= TOKENS <= 8), PDL (0/1).
#include "common.cuh"

#ifndef W_INT8
#define W_INT8 0
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
#ifndef ROWS
#define ROWS 4
#endif
#ifndef UNROLL
#define UNROLL 2
#endif
#ifndef WARPS
#define WARPS 1
#endif
#ifndef TOKENS
#define TOKENS 8
#endif
#ifndef PDL
#define PDL 0
#endif
typedef OUT_DTYPE out_t;

constexpr int MAX_TOKENS = 8;                     // the scratch's token slots (GEMV_MAX_TOKENS)
constexpr int MATS = EPILOGUE == 1 ? 2 : 1;       // weight matrices per block: gate (and up)
constexpr int WROWS = MATS * ROWS;                // weight rows a warp streams
constexpr int LANE_K = W_INT8 ? 16 : 8;           // k of one lane's 16-byte weight chunk
constexpr int STEP_K = 32 * LANE_K;               // k of one warp step: 512 bytes of a row
constexpr int XVECS = LANE_K / 8;                 // 16-byte x chunks (8 bf16) per lane and step
static_assert(TOKENS >= 1 && TOKENS <= MAX_TOKENS, "TOKENS: 1..8");
static_assert(UNROLL >= 1 && UNROLL <= 4, "UNROLL: 1..4");

#if W_INT8
typedef signed char w_t;
#else
typedef bf16_t w_t;
#endif

// common.cuh's xielu_f32 written out as the fused multiply-adds a compiler would contract it
// to, so that every build rounds it the same way.
__device__ __forceinline__ float xielu_fma(float v, float alpha_p, float alpha_n, float beta,
                                           float eps) {
    return v > 0.0f ? fmaf(alpha_p * v, v, beta * v)
                    : fmaf(expm1f(fminf(v, eps)) - v, alpha_n, beta * v);
}

// The LANE_K weights of a chunk as float32 (element i = k + i).
__device__ __forceinline__ void weights_to_float(const uint4& c, float (&f)[LANE_K]) {
    const u32 words[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#if W_INT8
        float q[4];
        weight8x4_to_float4(words[i], q);
#pragma unroll
        for (int j = 0; j < 4; ++j) f[4 * i + j] = q[j];
#else
        f[2 * i] = bf16_lo(words[i]);
        f[2 * i + 1] = bf16_hi(words[i]);
#endif
    }
}

// acc += sum_i w[i] * x[i] over one chunk, one fmaf at a time in increasing k.
__device__ __forceinline__ void dot_chunk(float& acc, const float (&w)[LANE_K],
                                          const uint4 (&x)[XVECS]) {
#pragma unroll
    for (int v = 0; v < XVECS; ++v) {
        const u32 words[4] = {x[v].x, x[v].y, x[v].z, x[v].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            acc = fmaf(w[8 * v + 2 * i], bf16_lo(words[i]), acc);
            acc = fmaf(w[8 * v + 2 * i + 1], bf16_hi(words[i]), acc);
        }
    }
}

// One warp's stream: its rows, its k range, and the round schedule. Round j of the warp holds
// its steps (j * UNROLL + u) * WARPS + warp, u < UNROLL, of its split's K range.
struct Stream {
    const w_t* w[WROWS];  // weight row i (mat i / ROWS, row i % ROWS) at this lane's first k
    const bf16_t* x;      // token 0's x at the same k
    i64 x_stride;
    int n;
    int k_left;           // k of the split's range from this lane's first k to its end
    int full_rounds;      // rounds with every step inside the range
    int rounds;           // full_rounds, plus one masked round if the range has a tail

    // Element offset of step u of round j from the lane's first k.
    __device__ __forceinline__ static int offset(int j, int u) {
        return (j * UNROLL + u) * WARPS * STEP_K;
    }

    // The weights of round j (MASKED: only chunks inside the range; zeros elsewhere).
    template <bool MASKED>
    __device__ __forceinline__ void load(uint4 (&buf)[UNROLL][WROWS], int j) const {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int off = offset(j, u);
            const bool valid = !MASKED || off < k_left;
#pragma unroll
            for (int i = 0; i < WROWS; ++i)
                buf[u][i] = valid ? load_stream(w[i] + off) : make_uint4(0, 0, 0, 0);
        }
    }

    template <bool MASKED>
    __device__ __forceinline__ void math(const uint4 (&buf)[UNROLL][WROWS], int j,
                                         float (&acc)[TOKENS][WROWS]) const {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int off = offset(j, u);
            if (MASKED && off >= k_left) continue;  // past K: nothing to add
            // x chunks of this step for every token (L1 hits after the first warp)
            uint4 xv[TOKENS][XVECS];
#pragma unroll
            for (int t = 0; t < TOKENS; ++t) {
                const uint4* xt = reinterpret_cast<const uint4*>(x + t * x_stride + off);
#pragma unroll
                for (int v = 0; v < XVECS; ++v)
                    if (TOKENS == 1 || t < n) xv[t][v] = __ldg(xt + v);
            }
#pragma unroll
            for (int i = 0; i < WROWS; ++i) {
                float wf[LANE_K];
                weights_to_float(buf[u][i], wf);
#pragma unroll
                for (int t = 0; t < TOKENS; ++t)
                    if (TOKENS == 1 || t < n) dot_chunk(acc[t][i], wf, xv[t]);
            }
        }
    }

    // Round j, in the masked form for the tail round; nothing past the last round.
    __device__ __forceinline__ void load_round(uint4 (&buf)[UNROLL][WROWS], int j) const {
        if (j < full_rounds) load<false>(buf, j);
        else if (j < rounds) load<true>(buf, j);
    }
    __device__ __forceinline__ void math_round(const uint4 (&buf)[UNROLL][WROWS], int j,
                                               float (&acc)[TOKENS][WROWS]) const {
        if (j < full_rounds) math<false>(buf, j, acc);
        else math<true>(buf, j, acc);
    }
};

extern "C" __global__ void __launch_bounds__(WARPS * 32)
gemv_rows(out_t* __restrict__ out, const bf16_t* __restrict__ x, const w_t* __restrict__ w,
          const float* __restrict__ w_scale, int n, int K, int O, i64 x_stride, float alpha_p,
          float alpha_n, float beta, float eps, int k_split, float* __restrict__ scratch,
          int* __restrict__ counters) {
    __shared__ float partial[WARPS][TOKENS][WROWS];  // the warps' sums
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row_base = blockIdx.x * ROWS;
    const int split = blockIdx.y, splits = gridDim.y;
    const int k_lo = split * k_split, k_hi = min(K, k_lo + k_split);

    Stream s;
    const int lane_k = k_lo + warp * STEP_K + lane * LANE_K;  // this lane's first k
#pragma unroll
    for (int i = 0; i < WROWS; ++i) {
        // Rows past O (the last tile) read row O - 1 again; their sums are dropped.
        const int row = min(row_base + i % ROWS, O - 1);
        s.w[i] = w + ((i64)(i / ROWS) * O + row) * K + lane_k;
    }
    s.x = x + lane_k;
    s.x_stride = x_stride;
    s.n = n;
    s.k_left = k_hi - lane_k;
    constexpr int ROUND_K = UNROLL * WARPS * STEP_K;  // k of one round of the block's warps
    const int span = max(0, k_hi - k_lo);
    s.full_rounds = span / ROUND_K;
    s.rounds = (span + ROUND_K - 1) / ROUND_K;

    float acc[TOKENS][WROWS];
#pragma unroll
    for (int t = 0; t < TOKENS; ++t)
#pragma unroll
        for (int i = 0; i < WROWS; ++i) acc[t][i] = 0.0f;

    // Two register buffers: the loads of round j + 1 are in flight during the math of round j.
    uint4 buf_a[UNROLL][WROWS], buf_b[UNROLL][WROWS];
#if PDL
    pdl_launch_dependents();
#endif
    s.load_round(buf_a, 0);
#if PDL
    pdl_wait();  // x, the output and the scratch belong to the previous kernels until here
#endif
    for (int j = 0; j < s.rounds; j += 2) {
        s.load_round(buf_b, j + 1);
        s.math_round(buf_a, j, acc);
        if (j + 1 >= s.rounds) break;
        s.load_round(buf_a, j + 2);
        s.math_round(buf_b, j + 1, acc);
    }

    // Sum over the warp (the same bits in every lane), then over the block's warps in order.
#pragma unroll
    for (int t = 0; t < TOKENS; ++t) {
        if (TOKENS > 1 && t >= n) continue;
#pragma unroll
        for (int i = 0; i < WROWS; ++i) {
            const float v = warp_sum(acc[t][i]);
            if (lane == 0) partial[warp][t][i] = v;
        }
    }
    __syncthreads();

    // Thread idx -> (token idx / ROWS, row idx % ROWS); sums[m]: gate (and up) of that row.
    auto block_sums = [&](int t, int r, float (&sums)[MATS]) {
#pragma unroll
        for (int m = 0; m < MATS; ++m) {
            float v = partial[0][t][m * ROWS + r];
#pragma unroll
            for (int wi = 1; wi < WARPS; ++wi) v += partial[wi][t][m * ROWS + r];
            sums[m] = v;
        }
    };
    auto epilogue = [&](int t, int row, float (&v)[MATS]) {
#pragma unroll
        for (int m = 0; m < MATS; ++m) {
#if W_INT8
            v[m] *= w_scale[(i64)m * O + row];
#endif
        }
        float y;
#if EPILOGUE == 1
        // transformers: gate, up = bf16 projections; act = bf16(silu(gate)); out = bf16(act * up)
        const float gate = round_to<bf16_t>(v[0]), up = round_to<bf16_t>(v[MATS - 1]);
        y = round_to<bf16_t>(silu(gate)) * up;
#elif EPILOGUE == 2
        y = xielu_fma(round_to<bf16_t>(v[0]), alpha_p, alpha_n, beta, eps);
#else
        y = ROUND_BF16 ? round_to<bf16_t>(v[0]) : v[0];
#endif
        out[(i64)t * O + row] = from_float<out_t>(y);
    };

    const int outputs = n * ROWS;
    if (splits == 1) {
        for (int idx = threadIdx.x; idx < outputs; idx += WARPS * 32) {
            const int t = idx / ROWS, r = idx % ROWS, row = row_base + r;
            if (row >= O) continue;
            float v[MATS];
            block_sums(t, r, v);
            epilogue(t, row, v);
        }
        return;
    }

    // --- split-K: partials to the scratch [split][mat][token][O]; the last block sums them ---
    for (int idx = threadIdx.x; idx < outputs; idx += WARPS * 32) {
        const int t = idx / ROWS, r = idx % ROWS, row = row_base + r;
        if (row >= O) continue;
        float v[MATS];
        block_sums(t, r, v);
#pragma unroll
        for (int m = 0; m < MATS; ++m)
            scratch[((i64)(split * MATS + m) * MAX_TOKENS + t) * O + row] = v[m];
    }
    if (!last_split_to_arrive(counters + blockIdx.x, splits)) return;
    for (int idx = threadIdx.x; idx < outputs; idx += WARPS * 32) {
        const int t = idx / ROWS, r = idx % ROWS, row = row_base + r;
        if (row >= O) continue;
        float v[MATS];
#pragma unroll
        for (int m = 0; m < MATS; ++m) {
            const float* p = scratch + ((i64)m * MAX_TOKENS + t) * O + row;
            float sum = __ldcg(p);  // L2: another SM wrote it
            for (int sp = 1; sp < splits; ++sp) sum += __ldcg(p + (i64)sp * MATS * MAX_TOKENS * O);
            v[m] = sum;
        }
        epilogue(t, row, v);
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // re-armed for the next launch / graph replay
}
