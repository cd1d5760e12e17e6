// gemm_invariant.cu's running sums and the K-order walk of WALK_K (the defines and constants of
// gemm_invariant.cu: WT, NTW, PARTS, PER_RUN, PART_CHUNK, SPLIT, STAGE_STEPS, BLOCKED_PARTS).
#pragma once

// A warp's sums of one kind (a part's, a run's, the block's): [tile][its token tile][mma element].
typedef float Sums[WT][NTW][4];

// into += from; from = 0 (a part's sum joins its run's, a run's the block's).
__device__ __forceinline__ void fold(Sums& into, Sums& from) {
#pragma unroll
    for (int m = 0; m < WT; ++m)
#pragma unroll
        for (int j = 0; j < NTW; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                into[m][j][e] += from[m][j][e];
                from[m][j][e] = 0.0f;
            }
}

// The parts a block adds: one run's (SPLIT) or all.
constexpr int PER_BLOCK = SPLIT ? PER_RUN : PARTS;

// WALK_K: a round of the parts deals PARTS * PART_CHUNK steps; the block's parts (part_lo on)
// take CYCLE contiguous ones of each round, from part_lo * PART_CHUNK. Slot i of the block's walk
// is step walk_step(i) and belongs to the block's part i % CYCLE / PART_CHUNK: known at compile
// time in a stage's unrolled loop when a stage holds whole rounds.
constexpr int CYCLE = PER_BLOCK * PART_CHUNK;
#if WALK_K
static_assert(!BLOCKED_PARTS, "WALK_K walks interleaved parts");
static_assert(STAGE_STEPS % CYCLE == 0, "WALK_K: a stage holds whole rounds of the block's parts");
constexpr int PART_SUMS = PER_BLOCK;  // one running sum a part
#else
constexpr int PART_SUMS = 1;  // the part being walked
#endif

__device__ __forceinline__ int walk_step(int i, int part_lo) {
    return i / CYCLE * (PARTS * PART_CHUNK) + part_lo * PART_CHUNK + i % CYCLE;
}

// The block's slots: whole rounds (the last round's steps past K are skipped, not read).
__device__ __forceinline__ int walk_slots(int steps) {
    return (steps + PARTS * PART_CHUNK - 1) / (PARTS * PART_CHUNK) * CYCLE;
}
