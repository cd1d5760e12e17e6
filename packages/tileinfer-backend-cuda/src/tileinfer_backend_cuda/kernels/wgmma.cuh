// Hopper's warpgroup products (wgmma, sm_90a: built with ARCH_SPECIFIC): D (64 x N, float32)
// += A (64 x 16, bf16) B (16 x N, bf16) issued by the 4 warps of a warpgroup together. A comes
// from registers, each warp's 16 rows in mma.sync m16n8k16's A fragment (a0: row g, k 2t, 2t + 1;
// a1: row g + 8; a2, a3: k + 8); B from shared memory through a descriptor; D in each warp's
// registers as mma.sync's accumulators of its N / 8 token tiles (d[j][0..1]: row g, tokens 8j +
// 2t, + 1; d[j][2..3]: row g + 8). Used by gemm_invariant.cu's WGMMA build, which includes it
// after its constants: transpose_x, at the end, lays its x out for these products.
#pragma once

// Shared-memory descriptor of B in K-major core matrices of 8 tokens x 8 k (16 bytes a token,
// 128 bytes a matrix), no swizzle: `addr` the first matrix, `k_stride` the bytes between the
// matrices of k 0..7 and 8..15 (the descriptor's leading offset), `n_stride` the bytes between
// token tiles (its stride offset).
__device__ __forceinline__ unsigned long long wgmma_desc(u32 addr, u32 k_stride, u32 n_stride) {
    return (unsigned long long)((addr >> 4) & 0x3FFF)
           | ((unsigned long long)((k_stride >> 4) & 0x3FFF) << 16)
           | ((unsigned long long)((n_stride >> 4) & 0x3FFF) << 32);
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_wait_all() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Shared-memory writes by threads, made visible to the wgmma that reads them.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// d += A B for NT token tiles (N = 8 NT).
template <int NT_>
__device__ __forceinline__ void wgmma_bf16(float (&d)[NT_][4], u32 a0, u32 a1, u32 a2, u32 a3,
                                           unsigned long long desc);

template <>
__device__ __forceinline__ void wgmma_bf16<1>(float (&d)[1][4], u32 a0, u32 a1, u32 a2, u32 a3,
                                              unsigned long long desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_bf16<2>(float (&d)[2][4], u32 a0, u32 a1, u32 a2, u32 a3,
                                              unsigned long long desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, "
        "{%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_bf16<4>(float (&d)[4][4], u32 a0, u32 a1, u32 a2, u32 a3,
                                              unsigned long long desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "
        "{%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_bf16<8>(float (&d)[8][4], u32 a0, u32 a1, u32 a2, u32 a3,
                                              unsigned long long desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(1));
}

// --- gemm_invariant.cu's x for wgmma (reads its NT, XVECS and PRODUCTS) ---

// wgmma's B for one step: x in K-major core matrices of 8 tokens x 8 k (16 bytes a token),
// product p's token tile j at ((p NT + j) 256) bytes, its k 0..7 and 8..15 128 bytes apart. A
// product pairs k as gemv.cu's fragments do: lane t's 16-byte chunk (k 8t .. 8t + 7 of the step,
// XVECS chunks with INT8 weights) holds in its 32-bit word 2p product p's k 2t, 2t + 1 and in word
// 2p + 1 its k 2t + 8, 2t + 9. So a token's row of product p, half h is word 2p + h of its 4
// lanes' chunks: the 4 x 4 transpose of the token's words. One thread a token (8 NT of them).
__device__ __forceinline__ void transpose_x(uint4* __restrict__ xb, const uint4* __restrict__ cells,
                                            int tok) {
    const int j = tok >> 3, gx = tok & 7;
    u32 word[4][2 * PRODUCTS];  // [lane t][word of its chunks]
#pragma unroll
    for (int v = 0; v < XVECS; ++v)
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const uint4 c = cells[(j * XVECS + v) * 32 + gx * 4 + t];
            word[t][4 * v] = c.x, word[t][4 * v + 1] = c.y;
            word[t][4 * v + 2] = c.z, word[t][4 * v + 3] = c.w;
        }
#pragma unroll
    for (int p = 0; p < PRODUCTS; ++p)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            xb[(p * NT + j) * 16 + h * 8 + gx] =
                make_uint4(word[0][2 * p + h], word[1][2 * p + h], word[2][2 * p + h],
                           word[3][2 * p + h]);
}
