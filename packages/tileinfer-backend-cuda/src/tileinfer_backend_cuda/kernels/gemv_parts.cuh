// Which K steps a part of a row's sum adds (gemv.cu's warps, gemm_invariant.cu's walk), out of
// `steps` steps of STEP_K, with `parts` parts. BLOCKED_PARTS = 0: part p takes the steps p,
// p + parts, p + 2 parts, ... (a block's warps read neighbouring chunks of a row at once);
// BLOCKED_PARTS = 1: the contiguous steps p * per .. p * per + per - 1, per = ceil(steps / parts)
// (a part's own reads run along the row, which a GEMM walking the parts one by one needs).
#pragma once

#ifndef BLOCKED_PARTS
#define BLOCKED_PARTS 0
#endif

// Steps of part p.
__device__ __forceinline__ int part_steps(int p, int steps, int parts) {
#if BLOCKED_PARTS
    const int per = (steps + parts - 1) / parts;
    return max(0, min(per, steps - p * per));
#else
    return p < steps ? (steps - p + parts - 1) / parts : 0;
#endif
}

// The index of part p's i-th step.
__device__ __forceinline__ int part_step(int p, int i, int steps, int parts) {
#if BLOCKED_PARTS
    return p * ((steps + parts - 1) / parts) + i;
#else
    return p + i * parts;
#endif
}

// Steps between a part's consecutive steps.
__device__ __forceinline__ constexpr int part_stride(int parts) {
    return BLOCKED_PARTS ? 1 : parts;
}

// A walk over the steps of the parts from `part` to `end` in part order, empty parts skipped
// (gemm_invariant.cu's block walks its parts so): the step's part, the part's steps left (this
// one included) and the step's index. Past the last step, part only grows.
struct PartWalk {
    int part, left, step;
    // From `part` on, the first part with steps: its first step.
    __device__ __forceinline__ void enter(int end, int steps, int parts) {
        for (; part < end; ++part) {
            left = part_steps(part, steps, parts);
            if (left > 0) break;
        }
        step = part_step(part, 0, steps, parts);
    }
    __device__ __forceinline__ void advance(int end, int steps, int parts) {
        if (--left > 0) {
            step += part_stride(parts);
        } else {
            ++part;
            enter(end, steps, parts);
        }
    }
};
