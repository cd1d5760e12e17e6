// gemv.cu's last phase: the block's partial sums (WARPS of every row and token, per group) meet
// in shared memory, are added in RUNS runs of WARPS / RUNS warps (each run's sum from zero in warp
// order, then the runs' sums in run order, as gemm_invariant.cu adds them where it splits a
// weight by run), scaled, put through the epilogue and written. Included after gemv.cu's defines,
// constants and gemv_epilogue.cuh.
#pragma once

// acc: this lane's accumulators (acc[m][j][0..1] = row g, tokens 8 j + 2t, + 1; acc[m][j][2..3]
// = row g + 8, the same tokens); partial: the block's shared memory, free of copies.
__device__ __forceinline__ void store_block_sums(
    out_t* __restrict__ out, float* partial, const float (&acc)[WT][NT][4], int group, int warp,
    int g, int t, int block_base, int n, int O, const float* __restrict__ w_scale,
    const float* tok_scale, float alpha_p, float alpha_n, float beta, float eps) {
    // partial[group][warp][tile][row][token], rows padded to TOKENS + 1 floats (no bank
    // conflicts).
    constexpr int PAD = TOKENS + 1;
    auto at = [&](int gi, int wi, int m, int r, int tok) -> float& {
        return partial[(((gi * WARPS + wi) * WT + m) * 16 + r) * PAD + tok];
    };
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
            float s = 0.0f;
#pragma unroll
            for (int q = 0; q < RUNS; ++q) {
                float r = 0.0f;
#pragma unroll
                for (int wi = q * (WARPS / RUNS); wi < (q + 1) * (WARPS / RUNS); ++wi)
                    r += at(gi, wi, m * TILES + r_in_group / 16, r_in_group % 16, tok);
                s += r;
            }
            v[m] = scaled_sum(s, m, tok, row, O, w_scale, tok_scale);
        }
        const float y = epilogue_value(v, alpha_p, alpha_n, beta, eps);
        out[(i64)tok * O + row] = from_float<out_t>(y);
    }
}
