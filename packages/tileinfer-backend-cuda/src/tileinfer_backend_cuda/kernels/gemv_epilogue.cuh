// A linear's output value of one row and token from its float32 sums, one per weight matrix
// (gemv.cu and gemm_invariant.cu, included after their defines and MATS): the FP8 token scale,
// the INT8 / FP8 row scale, then the epilogue and the rounding of the linear contract. Both
// kernels finish every sum with these same operations, so that their rows agree bit for bit.
#pragma once

// s (the sum of matrix m at row `row`, token `tok`) with its scales applied.
__device__ __forceinline__ float scaled_sum(float s, int m, int tok, int row, int O,
                                            const float* __restrict__ w_scale,
                                            const float* __restrict__ x_scale) {
#if W_FP8
    s *= x_scale[tok];
#endif
#if W_INT8 || W_FP8
    s *= w_scale[(i64)m * O + row];
#endif
    return s;
}

// The output value from the scaled sums v (gate and up with SwiGLU).
__device__ __forceinline__ float epilogue_value(const float (&v)[MATS], float alpha_p,
                                                float alpha_n, float beta, float eps) {
#if EPILOGUE == 1
    // transformers: gate, up = bf16 projections; act = bf16(silu(gate)); out = bf16(act * up)
    const float gate = round_to<bf16_t>(v[0]), up = round_to<bf16_t>(v[1]);
    return round_to<bf16_t>(silu(gate)) * up;
#elif EPILOGUE == 2
    return xielu_f32(round_to<bf16_t>(v[0]), alpha_p, alpha_n, beta, eps);
#else
    return ROUND_BF16 ? round_to<bf16_t>(v[0]) : v[0];
#endif
}
