// Hopper's warpgroup products (wgmma, sm_90a) as gemm_wgmma.cu and gemm_wgmma_ws.cu issue them
// (included after gemm_wgmma_block.cuh): the fences, commits and waits of their async groups, one
// product of 64 weight rows by 8 NT tokens by 16 k (bf16) or 32 k (W_FP8: e4m3) with both
// operands in shared memory, and a K step of a stage of their ring.
#pragma once

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_one() {  // all but the last committed group done
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
}
// This thread's cp.async writes, made visible to wgmma's reads (the async proxy).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// A product's k and operand types, and its tail: scale-d, the operands' scales (1: +) and, for
// bf16, their transposes (0: K-major). An e4m3 product takes 32 k, the same 32 bytes a row as
// bf16's 16 k, and has no transpose operands (K-major only).
#if W_FP8
#define WGMMA_K_TYPES "k32.f32.e4m3.e4m3 "
#define WGMMA_TAIL "p, 1, 1;\n}\n"
#else
#define WGMMA_K_TYPES "k16.f32.bf16.bf16 "
#define WGMMA_TAIL "p, 1, 1, 0, 0;\n}\n"
#endif

// d (64 rows x 8 NT tokens, mma.sync's accumulator layout per warp and token tile) += A B.
__device__ __forceinline__ void wgmma_product(float (&d)[NT][4], unsigned long long a,
                                              unsigned long long b) {
#if NT == 8
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64" WGMMA_K_TYPES
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "%32, %33, " WGMMA_TAIL
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(a), "l"(b), "r"(1));
#else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32" WGMMA_K_TYPES
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
        "%16, %17, " WGMMA_TAIL
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "l"(a), "l"(b), "r"(1));
#endif
}

// K step u of a ring stage (bytes 64u .. 64u + 63 of each row: two products) for every matrix:
// acc[m] += matrix m's weight rows from a_row by the tokens from b_row (gemm_wgmma_block.cuh's
// layout).
__device__ __forceinline__ void wgmma_stage_step(float (&acc)[MATS][NT][4], u32 stage, int u,
                                                 int a_row, int b_row) {
    wgmma_fence();
#pragma unroll
    for (int p = 0; p < 2; ++p)  // the stage's product 2u + p: bytes 64u + 32p ..
#pragma unroll
        for (int m = 0; m < MATS; ++m)
            wgmma_product(acc[m], wgmma_operand(stage, 2 * u + p, m * BLOCK_ROWS + a_row),
                          wgmma_operand(stage + W_STAGE, 2 * u + p, b_row));
}
