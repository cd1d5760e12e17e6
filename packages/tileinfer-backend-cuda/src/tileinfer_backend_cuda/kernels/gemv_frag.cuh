// gemv.cu's weight copies and tensor-core steps, included after its defines and constants:
// copy_w (a lane's weight chunk into the ring), the A fragments of a step (Frag, to_frag: bf16,
// INT8 converted exactly, FP8 as f16) and step_mma (one step of a tile against a token tile).
#pragma once

__device__ __forceinline__ void copy_w(u32 dst, const w_t* src, bool valid) {
    if (W_BYTES == 16) cp_async_cg16(dst, src, valid ? 16 : 0);
    else cp_async_ca8(dst, src, valid ? 8 : 0);
}

// One step's A fragments of a tile: bf16 pairs (k + 2i, k + 2i + 1) of rows g (a) and g + 8 (b),
// from the weight chunks wa and wb (INT8: converted exactly; FP8: f16 pairs).
struct Frag {
    u32 a[LANE_K / 2], b[LANE_K / 2];
};

__device__ __forceinline__ void to_frag(Frag& f, const uint4& wa, const uint4& wb) {
    const u32* pa = reinterpret_cast<const u32*>(&wa);
    const u32* pb = reinterpret_cast<const u32*>(&wb);
#if W_FP8
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        e4m3x4_to_f16x2(pa[i], f.a[2 * i], f.a[2 * i + 1]);
        e4m3x4_to_f16x2(pb[i], f.b[2 * i], f.b[2 * i + 1]);
    }
#elif !W_INT8
#pragma unroll
    for (int i = 0; i < 4; ++i) f.a[i] = pa[i], f.b[i] = pb[i];
#else
#pragma unroll
    for (int i = 0; i < LANE_K / 4; ++i) {
        weight8x4_to_bf16x2(pa[i], f.a[2 * i], f.a[2 * i + 1]);
        weight8x4_to_bf16x2(pb[i], f.b[2 * i], f.b[2 * i + 1]);
    }
#endif
}

// acc += one step of a tile (f) against one token tile's x chunks (xv).
__device__ __forceinline__ void step_mma(float (&acc)[4], const Frag& f, const uint4 (&xv)[XVECS]) {
#if W_FP8
    const u32* p8 = reinterpret_cast<const u32*>(&xv[0]);
    u32 px[8];  // the 16 e4m3 of x as f16 pairs, in the weight fragments' k order
#pragma unroll
    for (int i = 0; i < 4; ++i) e4m3x4_to_f16x2(p8[i], px[2 * i], px[2 * i + 1]);
#pragma unroll
    for (int j = 0; j < LANE_K / 4; ++j)
        mma_f16_16816(acc, f.a[2 * j], f.b[2 * j], f.a[2 * j + 1], f.b[2 * j + 1], px[2 * j],
                      px[2 * j + 1]);
#else
    const u32* px = reinterpret_cast<const u32*>(&xv[0]);
#pragma unroll
    for (int j = 0; j < LANE_K / 4; ++j)
        mma_bf16_16816(acc, f.a[2 * j], f.b[2 * j], f.a[2 * j + 1], f.b[2 * j + 1], px[2 * j],
                       px[2 * j + 1]);
#endif
}
