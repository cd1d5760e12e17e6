// Shared helpers of TileInfer's CUDA kernels. Compiled by NVRTC with no CUDA toolkit headers:
// bfloat16 and float16 are handled as 16-bit patterns with explicit conversions (PTX `cvt`, round
// to nearest even, as PyTorch rounds), and only NVRTC's built-in functions and vector types are used.
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// --- 16-bit float types as bit patterns -------------------------------------------------------

struct bf16_t { unsigned short bits; };
struct f16_t { unsigned short bits; };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16_t v) { return __uint_as_float(((u32)v.bits) << 16); }
__device__ __forceinline__ float to_float(f16_t v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}

template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float f) {
    bf16_t r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
    return r;
}
template <> __device__ __forceinline__ f16_t from_float<f16_t>(float f) {
    f16_t r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
    return r;
}

// The value of f rounded to T and back: "rounded to the dtype" as transformers does between ops.
template <typename T> __device__ __forceinline__ float round_to(float f) {
    return to_float(from_float<T>(f));
}

// Two floats to one register of two bf16 (lo in the low half), round to nearest even.
__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ float bf16_lo(u32 v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }

// The activations, in float32 as PyTorch computes them: silu(x) = x / (1 + exp(-x)); xIELU
// (arXiv:2411.13010) as transformers' XIELUActivation: x > 0: alpha_p * x^2 + beta * x; else
// (expm1(min(x, eps)) - x) * alpha_n + beta * x.
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float xielu_f32(float x, float alpha_p, float alpha_n, float beta,
                                           float eps) {
    return x > 0.0f ? alpha_p * x * x + beta * x
                    : (expm1f(fminf(x, eps)) - x) * alpha_n + beta * x;
}

// Smoothed keys (key = smooth * scale * int8) fold the smoothing into the query:
// q . (smooth * k) = (q * smooth) . k. The 8 bf16 query values v (k0..k0 + 8) times smooth[0..8)
// are split into bf16 hi + lo (error ~2^-16), two mma passes in the attention kernels.
__device__ __forceinline__ void split_smoothed_query(const uint4& v, const float* smooth,
                                                     uint4& hi, uint4& lo) {
    const u32* pv = reinterpret_cast<const u32*>(&v);
    u32* ph = reinterpret_cast<u32*>(&hi);
    u32* pl = reinterpret_cast<u32*>(&lo);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float a = bf16_lo(pv[e]) * smooth[2 * e], b = bf16_hi(pv[e]) * smooth[2 * e + 1];
        ph[e] = pack_bf16x2(a, b);
        pl[e] = pack_bf16x2(a - bf16_lo(ph[e]), b - bf16_hi(ph[e]));
    }
}

// Four int8 (the bytes of v) to two bf16x2 registers, exactly (|value| <= 128 fits bf16's 8 bits).
// Each byte b is biased to b + 128 and placed in the mantissa of 2^23 (0x4B000000 | byte), so
// the float is 2^23 + 128 + b; subtracting 2^23 + 128 leaves b exactly.
__device__ __forceinline__ void int8x4_to_bf16x2(u32 v, u32& lo, u32& hi) {
    const u32 biased = v ^ 0x80808080u;
    const float magic = 8388736.0f;  // 2^23 + 128
    float f0 = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7440)) - magic;
    float f1 = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7441)) - magic;
    float f2 = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7442)) - magic;
    float f3 = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7443)) - magic;
    lo = pack_bf16x2(f0, f1);
    hi = pack_bf16x2(f2, f3);
}

// The same trick to float32: f[i] = byte i of v, exactly, in two instructions an element (a byte
// permute and a subtraction) where a (float)int conversion runs at a quarter of FP32's rate.
__device__ __forceinline__ void int8x4_to_float4(u32 v, float (&f)[4]) {
    const u32 biased = v ^ 0x80808080u;
    const float magic = 8388736.0f;  // 2^23 + 128
    f[0] = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7440)) - magic;
    f[1] = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7441)) - magic;
    f[2] = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7442)) - magic;
    f[3] = __uint_as_float(__byte_perm(biased, 0x4B000000u, 0x7443)) - magic;
}

__device__ __forceinline__ float int8_to_float(signed char v) { return (float)(int)v; }

// Four e4m3 (the bytes of v, bit patterns) to two bf16x2 registers, exactly, on sm_80: each
// byte's sign, exponent and mantissa go to a bf16's places (exponent at the bottom of bf16's),
// which reads as the e4m3 value times 2^-120 (e4m3's bias is 7, bf16's 127; e4m3's subnormals
// m/8 * 2^-6 land on bf16's m/8 * 2^-126), then one exact product with 2^120 (a fused
// multiply-add of -0, which keeps a negative zero's sign, with subnormal inputs).
__device__ __forceinline__ u32 e4m3x2_to_bf16x2(u32 pair) {  // pair: bytes in bits 15..8, 31..24
    const u32 moved = (pair & 0x80008000u) | ((pair >> 4) & 0x07F007F0u);
    u32 r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(moved), "r"(0x7B807B80u),  // 2^120
        "r"(0x80008000u));
    return r;
}

__device__ __forceinline__ void e4m3x4_to_bf16x2(u32 v, u32& lo, u32& hi) {
    lo = e4m3x2_to_bf16x2(__byte_perm(v, 0u, 0x1404));  // bytes 0, 1 to the halves' tops
    hi = e4m3x2_to_bf16x2(__byte_perm(v, 0u, 0x3424));  // bytes 2, 3
}

// The same to float32 (a bf16's bits are the top half of its float32's).
__device__ __forceinline__ void e4m3x4_to_float4(u32 v, float (&f)[4]) {
    u32 lo, hi;
    e4m3x4_to_bf16x2(v, lo, hi);
    f[0] = __uint_as_float(lo << 16), f[1] = __uint_as_float(lo & 0xFFFF0000u);
    f[2] = __uint_as_float(hi << 16), f[3] = __uint_as_float(hi & 0xFFFF0000u);
}

// The one-byte weights of the linear kernels' W_INT8 builds: int8 values, or (W_E4M3) the bit
// patterns of e4m3 values (the weight-only FP8 product of tileinfer/backend/fp8.py).
#ifndef W_E4M3
#define W_E4M3 0
#endif

__device__ __forceinline__ void weight8x4_to_bf16x2(u32 v, u32& lo, u32& hi) {
    if (W_E4M3) e4m3x4_to_bf16x2(v, lo, hi);
    else int8x4_to_bf16x2(v, lo, hi);
}

__device__ __forceinline__ void weight8x4_to_float4(u32 v, float (&f)[4]) {
    if (W_E4M3) e4m3x4_to_float4(v, f);
    else int8x4_to_float4(v, f);
}

// --- chunked loads and stores -----------------------------------------------------------------
// N consecutive elements of T read or written with one access of N * sizeof(T) bytes (16, 8, 4 or
// 2 bytes); the pointer must be aligned to that size.

template <int BYTES> struct VecType;
template <> struct VecType<16> { typedef uint4 type; };
template <> struct VecType<8> { typedef uint2 type; };
template <> struct VecType<4> { typedef u32 type; };
template <> struct VecType<2> { typedef unsigned short type; };

template <typename T, int N>
__device__ __forceinline__ void load_chunk(const T* p, float (&v)[N]) {
    typedef typename VecType<N * sizeof(T)>::type V;
    V raw = *reinterpret_cast<const V*>(p);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = to_float(e[i]);
}

template <typename T, int N>
__device__ __forceinline__ void store_chunk(T* p, const float (&v)[N]) {
    typedef typename VecType<N * sizeof(T)>::type V;
    V raw;
    T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) e[i] = from_float<T>(v[i]);
    *reinterpret_cast<V*>(p) = raw;
}

// --- reductions -------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum (MAX = false) or maximum (MAX = true) over the block (blockDim.x a multiple of 32, at most
// 1024) in a fixed order; every thread gets the result. scratch: 32 floats of shared memory.
// Starts with a barrier (so scratch may be reused by one reduction after another).
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return MAX ? warp_max(v) : warp_sum(v);
}
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    return block_reduce<false>(v, scratch);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
    return block_reduce<true>(v, scratch);
}

// --- tensor-core helpers (sm_80+) -------------------------------------------------------------

// D += A * B for one m16n8k16 tile: A 16x16 bf16 (row major, 4 registers), B 16x8 bf16
// ("col": 2 registers), D 16x8 float32 (4 registers). Fragment layouts (g = lane / 4,
// t = lane % 4): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..];
// b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; d0,d1 = D[g][2t..2t+1], d2,d3 = D[g+8][2t..2t+1].
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3,
                                               u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// D += A * B for one m16n8k32 tile of int8 (exact int32 arithmetic): A 16x32 (row major, 4
// registers of 4 int8), B 32x8 ("col": 2 registers), D 16x8 int32. Layouts (g = lane / 4,
// t = lane % 4): a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][4t+16..], a3 = A[g+8][4t+16..];
// b0 = B[4t..4t+3][g], b1 = B[4t+16..4t+19][g]; d as mma_bf16_16816's.
__device__ __forceinline__ void mma_s8_16832(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                             u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Bytes 0 and 2 of v (int8) as a bf16x2, exactly (sm_90 SASS: four LOP3 and one HADD2.BF16;
// bytes 1 and 3 one shift more): with b = byte,
// 0x4300 | (b & 0x7f) is the bf16 128 + (b & 0x7f), and 0xc300 | (b & 0x80) is -128 (b >= 0) or
// -256 (b < 0); their sum (one bf16x2 fma by 1, exact: every term and the result are integers
// of at most 8 bits) is b. int8_odd_to_bf16x2: bytes 1 and 3.
__device__ __forceinline__ u32 int8_even_to_bf16x2(u32 v) {
    const u32 top = (v & 0x007f007fu) | 0x43004300u, bias = (v & 0x00800080u) | 0xc300c300u;
    u32 r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(top), "r"(0x3f803f80u), "r"(bias));
    return r;
}
__device__ __forceinline__ u32 int8_odd_to_bf16x2(u32 v) { return int8_even_to_bf16x2(v >> 8); }

__device__ __forceinline__ u32 smem_addr(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}

// --- thread block clusters (sm_90+) ------------------------------------------------------------
// Every thread of the cluster's blocks waits here; shared-memory writes before it are visible to
// the cluster's reads after it.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
                 ::: "memory");
#endif
}
// The float at p's place in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ float cluster_load(const float* p, int rank) {
    float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    u32 remote;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_addr(p)), "r"(rank));
    // volatile with a memory clobber: never moved above the cluster_sync it must follow
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
#endif
    return v;
}

// Four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

// Asynchronous copies global -> shared (sm_80+), which need no registers and which the compiler
// cannot sink next to their use: the way to keep many loads in flight. src_bytes = 0 copies
// nothing and fills the destination with zeros. cg: cached in L2 only (data read once);
// ca: cached in L1 too (data reused by other warps).
#if defined(STREAM_L2_256B)
#define CP_ASYNC_CG "cp.async.cg.shared.global.L2::256B"
#else
#define CP_ASYNC_CG "cp.async.cg.shared.global"
#endif
__device__ __forceinline__ void cp_async_cg16(u32 dst, const void* src, int src_bytes) {
    asm volatile(CP_ASYNC_CG " [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_ca16(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_ca8(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_ca4(u32 dst, const void* src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most N of this thread's committed groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// A 16-byte load of data read once (a weight chunk): not kept in L1.
__device__ __forceinline__ uint4 load_stream(const void* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// Split-K / split-KV arrival, called by every thread of a block after it wrote its partials:
// counts the block on `counter` (one per output tile, zero between launches) and tells every
// thread whether it arrived last of `splits`; that block then sees every split's partials (and
// re-arms the counter). Ends with a barrier.
__device__ __forceinline__ bool last_split_to_arrive(int* counter, int splits) {
    __shared__ int is_last;
    __threadfence();  // this block's partials are visible before it is counted
    __syncthreads();
    if (threadIdx.x == 0) is_last = atomicAdd(counter, 1) == splits - 1;
    __syncthreads();
    if (!is_last) return false;
    __threadfence();  // the other blocks' partials are visible from here
    return true;
}

// --- programmatic dependent launch (sm_90+) ----------------------------------------------------
// A kernel launched with programmatic stream serialization (tuning.pdl) may start before the
// previous kernel on the stream has finished: it must call pdl_wait() before it reads what that
// kernel wrote or writes what it reads; pdl_wait() returns once the previous grid has completed
// and its memory is visible. pdl_launch_dependents() lets the next such kernel start early (its
// blocks can begin their independent prologue, e.g. weight prefetch). Both are no-ops for
// ordinary launches and before sm_90.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
