// Which K steps a part of a row's sum adds (gemv.cu's warps, gemm_invariant.cu's walk), out of
// `steps` steps of STEP_K, with `parts` parts. BLOCKED_PARTS = 0: the steps are dealt to the
// parts in chunks of PART_CHUNK (default 1) in turn: part p takes the chunks p, p + parts,
// p + 2 parts, ..., chunk c being the steps c * PART_CHUNK .. c * PART_CHUNK + PART_CHUNK - 1 (a
// block's warps read neighbouring chunks of a row at once; a longer chunk is a longer read
// along the row for a GEMM that walks the parts one by one); BLOCKED_PARTS = 1: the contiguous
// steps p * per .. p * per + per - 1, per = ceil(steps / parts) (one chunk a part).
#pragma once

#ifndef BLOCKED_PARTS
#define BLOCKED_PARTS 0
#endif
#ifndef PART_CHUNK
#define PART_CHUNK 1
#endif
static_assert(PART_CHUNK >= 1 && (PART_CHUNK & (PART_CHUNK - 1)) == 0,
              "PART_CHUNK: a power of two");

// Steps of part p.
__device__ __forceinline__ int part_steps(int p, int steps, int parts) {
#if BLOCKED_PARTS
    const int per = (steps + parts - 1) / parts;
    return max(0, min(per, steps - p * per));
#else
    // Whole rounds of parts * PART_CHUNK steps, then what of the last round falls in p's chunk.
    const int round = parts * PART_CHUNK;
    return steps / round * PART_CHUNK + max(0, min(PART_CHUNK, steps % round - p * PART_CHUNK));
#endif
}

// The index of part p's i-th step.
__device__ __forceinline__ int part_step(int p, int i, int steps, int parts) {
#if BLOCKED_PARTS
    return p * ((steps + parts - 1) / parts) + i;
#else
    return (i / PART_CHUNK * parts + p) * PART_CHUNK + i % PART_CHUNK;
#endif
}

// The step after part p's step s (s one of p's steps): the next in its chunk, or the first of
// its next chunk (chunks start at multiples of PART_CHUNK).
__device__ __forceinline__ int part_next(int s, int parts) {
#if BLOCKED_PARTS
    return s + 1;
#else
    return (s + 1) % PART_CHUNK ? s + 1 : s + (parts - 1) * PART_CHUNK + 1;
#endif
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
            step = part_next(step, parts);
        } else {
            ++part;
            enter(end, steps, parts);
        }
    }
};
