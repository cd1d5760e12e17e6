// sampling.cu's building blocks, included after its THREADS, WARPS and FIXED_ONE: the
// counter-based random stream of tileinfer.sampling, float32 order keys and fixed-point masses,
// and block reductions in a fixed order (deterministic).
#pragma once

// --- the counter-based random stream (tileinfer.sampling) --------------------------------------

__device__ __forceinline__ u32 mix32(u32 x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x1B873593u;
    x ^= x >> 16;
    return x;
}
__device__ __forceinline__ u32 stream_key(i64 seed, i64 counter) {
    u32 key = mix32((u32)seed ^ 0x9E3779B9u);
    key = mix32(key ^ (u32)((u64)seed >> 32));
    return mix32(key ^ (u32)counter);
}
__device__ __forceinline__ float uniform(u32 key, u32 index) {
    const u32 bits = mix32(mix32(key ^ index)) >> 9;  // 23 bits: bits + 0.5 is exact
    return ((float)bits + 0.5f) * (1.0f / 8388608.0f);
}
__device__ __forceinline__ float gumbel(u32 key, u32 index) {
    return -logf(-logf(uniform(key, index)));
}

// Float32 -> int32 with the same order (negative floats flip their magnitude bits).
__device__ __forceinline__ int order_key(float v) {
    const int bits = __float_as_int(v);
    return bits >= 0 ? bits : bits ^ 0x7FFFFFFF;
}
__device__ __forceinline__ u64 fixed_mass(float e) { return __float2ull_rz(e * FIXED_ONE); }

// --- block reductions (fixed order: deterministic) ---------------------------------------------

struct Shared {
    int cand_key[CAP];
    float cand_e[CAP];
    u32 hist[257];
    float red_f[WARPS];
    int red_i[WARPS];
    u64 red_u[WARPS];
    int n_cand;
    int digit, remaining;
    int accept;
};

__device__ __forceinline__ float block_max(float v, Shared& sh) {
    v = warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red_f[threadIdx.x >> 5] = v;
    __syncthreads();
    return warp_max(sh.red_f[threadIdx.x & 31]);
}
__device__ __forceinline__ float block_sum_f(float v, Shared& sh) {
    v = warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red_f[threadIdx.x >> 5] = v;
    __syncthreads();
    return warp_sum(sh.red_f[threadIdx.x & 31]);
}
__device__ __forceinline__ u64 block_sum_u64(u64 v, Shared& sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) sh.red_u[threadIdx.x >> 5] = v;
    __syncthreads();
    v = sh.red_u[threadIdx.x & 31];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// argmax with the lowest index on ties (torch.argmax); (-inf, huge) when nothing is valid.
__device__ __forceinline__ void better(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) { v = v2; i = i2; }
}
// The warp's best (value, index) in every lane (better(): the lower index on ties).
__device__ __forceinline__ void warp_argmax(float& v, int& i) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}
__device__ __forceinline__ int block_argmax(float v, int i, Shared& sh) {
    warp_argmax(v, i);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) { sh.red_f[threadIdx.x >> 5] = v; sh.red_i[threadIdx.x >> 5] = i; }
    __syncthreads();
    v = sh.red_f[threadIdx.x & 31];
    i = sh.red_i[threadIdx.x & 31];
    warp_argmax(v, i);
    return i;
}
