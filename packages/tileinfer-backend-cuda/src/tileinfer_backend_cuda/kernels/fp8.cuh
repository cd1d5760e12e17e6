// FP8 (e4m3) helpers, sm_89 and newer: conversions to and from e4m3 and the f16 mma that
// gemv.cu's FP8 build runs on (every e4m3 value is an f16, so the products stay exact).
#pragma once
#include "common.cuh"

// Four e4m3 (the bytes of v) to two f16x2 registers, exactly: lo holds bytes 0 and 1 (byte 0 in
// the low half), hi bytes 2 and 3.
__device__ __forceinline__ void e4m3x4_to_f16x2(u32 v, u32& lo, u32& hi) {
    asm("{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, %2;\n\t"
        "cvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %1, h;\n\t}"
        : "=r"(lo), "=r"(hi) : "r"(v));
}

// Two floats to two e4m3 bytes (lo in the low byte), rounded to nearest even, clamped to the
// finite range (cvt puts its first source in the high byte).
__device__ __forceinline__ unsigned short float2_to_e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// The largest |value| of a 16-byte chunk of 8 bf16.
__device__ __forceinline__ float chunk_amax(const uint4& v) {
    const u32* p = reinterpret_cast<const u32*>(&v);
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i)
        amax = fmaxf(amax, fmaxf(fabsf(bf16_lo(p[i])), fabsf(bf16_hi(p[i]))));
    return amax;
}

// The scale of a row whose largest |value| is amax: amax / 448 (IEEE division), 1 for zeros.
__device__ __forceinline__ float row_scale(float amax) {
    return amax > 0.0f ? amax / 448.0f : 1.0f;
}

// A chunk of 8 bf16 divided by scale and rounded to 8 e4m3 bytes (element 0 in the low byte).
__device__ __forceinline__ uint2 chunk_e4m3(const uint4& v, float scale) {
    const u32* p = reinterpret_cast<const u32*>(&v);
    u32 packed[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u32 b0 = float2_to_e4m3x2(bf16_lo(p[2 * i]) / scale, bf16_hi(p[2 * i]) / scale);
        const u32 b1 =
            float2_to_e4m3x2(bf16_lo(p[2 * i + 1]) / scale, bf16_hi(p[2 * i + 1]) / scale);
        packed[i] = b0 | (b1 << 16);
    }
    return make_uint2(packed[0], packed[1]);
}

// D += A * B for one m16n8k16 tile of f16 inputs, float32 accumulation; the fragment layouts of
// mma_bf16_16816 (common.cuh).
__device__ __forceinline__ void mma_f16_16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3,
                                              u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
