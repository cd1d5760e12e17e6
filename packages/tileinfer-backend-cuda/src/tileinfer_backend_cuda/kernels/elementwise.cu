// Elementwise ops: embedding lookup, SwiGLU's silu(gate) * up, xIELU, rotary embedding, and int8
// to bf16 (an INT8 weight's values for cuBLAS, ops/int8_cublas.py).
//
// Defines: DTYPE, the activation element type T (bf16_t, f16_t or float); VEC, elements per
// access (16 / sizeof(T) when the shapes and pointers allow 16-byte accesses, else 1).
#include "common.cuh"

#ifndef DTYPE
#define DTYPE bf16_t
#endif
#ifndef VEC
#define VEC 1
#endif
typedef DTYPE T;

// embed: out[i, :] = table[ids[i], :] for out (n, row) and table (vocab, row), copied as raw
// 16-bit words (every supported dtype is a whole number of them); `words` = row size in 16-bit
// words, a multiple of 8 when VEC16 is set (then copied as uint4). One block per token.
// An id outside [0, vocab) gives a row of zeros instead of reading out of bounds.
extern "C" __global__ void embed(unsigned short* __restrict__ out,
                                 const unsigned short* __restrict__ table,
                                 const int* __restrict__ ids, int vocab, int words) {
    const int i = blockIdx.x;
    const int id = ids[i];
    const bool valid = id >= 0 && id < vocab;
    const unsigned short* src = table + (i64)(valid ? id : 0) * words;
    unsigned short* dst = out + (i64)i * words;
#if defined(VEC16)
    const int chunks = words / 8;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        uint4 v = valid ? reinterpret_cast<const uint4*>(src)[c] : make_uint4(0, 0, 0, 0);
        reinterpret_cast<uint4*>(dst)[c] = v;
    }
#else
    for (int c = threadIdx.x; c < words; c += blockDim.x) dst[c] = valid ? src[c] : 0;
#endif
}

// silu_mul: out (n, inter) = silu(gate) * up for gate_up (n, 2 * inter) = [gate | up].
// silu(gate) is rounded to T before the product (transformers computes act_fn(gate) * up).
// One thread per VEC outputs; inter is a multiple of VEC.
extern "C" __global__ void silu_mul(T* __restrict__ out, const T* __restrict__ gate_up, int n,
                                    int inter) {
    const i64 chunk = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const int per_row = inter / VEC;
    if (chunk >= (i64)n * per_row) return;
    const i64 row = chunk / per_row;
    const int col = (int)(chunk - row * per_row) * VEC;
    float g[VEC], u[VEC], o[VEC];
    load_chunk<T, VEC>(gate_up + row * 2 * inter + col, g);
    load_chunk<T, VEC>(gate_up + row * 2 * inter + inter + col, u);
#pragma unroll
    for (int e = 0; e < VEC; ++e) o[e] = round_to<T>(silu(g[e])) * u[e];
    store_chunk<T, VEC>(out + row * inter + col, o);
}

// xielu: out = xielu(x) elementwise over `count` elements (a multiple of VEC); out may be x.
extern "C" __global__ void xielu(T* out, const T* x, i64 count, float alpha_p, float alpha_n,
                                 float beta, float eps) {
    const i64 i = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= count) return;
    float v[VEC];
    load_chunk<T, VEC>(x + i, v);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = xielu_f32(v[e], alpha_p, alpha_n, beta, eps);
    store_chunk<T, VEC>(out + i, v);
}

// weight8_to_bf16: out[i] = in[i] (exact: every int8, and with W_E4M3 every e4m3 value, is a
// bf16) over `chunks` 16-byte chunks of in, each thread a chunk: one 16-byte load, two 16-byte
// stores.
extern "C" __global__ void weight8_to_bf16(uint4* __restrict__ out, const uint4* __restrict__ in,
                                           i64 chunks) {
    const i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= chunks) return;
    const uint4 v = in[c];
    uint4 lo, hi;
    weight8x4_to_bf16x2(v.x, lo.x, lo.y);
    weight8x4_to_bf16x2(v.y, lo.z, lo.w);
    weight8x4_to_bf16x2(v.z, hi.x, hi.y);
    weight8x4_to_bf16x2(v.w, hi.z, hi.w);
    out[2 * c] = lo;
    out[2 * c + 1] = hi;
}

// rope: "rotate half" rotary embedding. x, out: (n, heads, head_dim) with element strides
// (x_tok, x_head) and (o_tok, o_head), last dim contiguous; cos, sin: (max_len, half) float32;
// positions: (n,) int32. One thread per (token, head, i < half) rotates the pair (i, i + half)
// in float32 and rounds once. out may be x.
extern "C" __global__ void rope(T* out, const T* x, const float* __restrict__ cos_table,
                                const float* __restrict__ sin_table,
                                const int* __restrict__ positions, int n, int heads, int half,
                                i64 x_tok, i64 x_head, i64 o_tok, i64 o_head) {
    const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (i64)n * heads * half) return;
    const int i = (int)(idx % half);
    const i64 th = idx / half;
    const int h = (int)(th % heads);
    const int t = (int)(th / heads);
    const i64 pos = positions[t];
    const float c = cos_table[pos * half + i], s = sin_table[pos * half + i];
    const T* src = x + t * x_tok + h * x_head;
    const float x1 = to_float(src[i]), x2 = to_float(src[i + half]);
    T* dst = out + t * o_tok + h * o_head;
    dst[i] = from_float<T>(x1 * c - x2 * s);
    dst[i + half] = from_float<T>(x2 * c + x1 * s);
}
