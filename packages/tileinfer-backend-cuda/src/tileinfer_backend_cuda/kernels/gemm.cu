// Prefill GEMM: out (M, N) = x (M, K) @ W.T, x bf16, W (N, K) bf16 or int8 with a float32 scale
// per output row, float32 accumulation. Used for many tokens where the weight is INT8 or the
// output float32 (bf16 x bf16 -> bf16 prefill GEMMs go to cuBLAS through PyTorch).
//
// A classic tensor-core tiling (as in CUTLASS's sm80 GEMMs, simplified): a block computes a
// 128 x 128 tile of out from 128 x 32 tiles of x and W in shared memory; 8 warps, each a 64 x 32
// sub-tile with mma.m16n8k16 (bf16 in, float32 accumulate), fragments read with ldmatrix.
// Double buffered: the next k-tile is loaded into registers while the current one is
// multiplied, then stored to the other shared buffer. INT8 weights are converted to bf16
// (exactly) on the way into shared memory; the per-row scale multiplies the float32 sum.
// Shared tiles are rows of 32 bf16 = four 16-byte chunks; chunk c of row r is stored at
// c ^ ((r / 2) % 4), so the 8 rows an ldmatrix reads hit 8 different bank groups.
//
// Grid: (ceil(N / 128), ceil(M / 128)); block: 256 threads. K % 8 == 0.
// Defines: W_INT8 (0/1), W_E4M3 (0/1: the one-byte weights are e4m3, common.cuh),
// OUT_DTYPE (bf16_t or float), ROUND_BF16 (round the sum to bf16 first).
#include "common.cuh"

#ifndef W_INT8
#define W_INT8 0
#endif
#ifndef OUT_DTYPE
#define OUT_DTYPE bf16_t
#endif
#ifndef ROUND_BF16
#define ROUND_BF16 1
#endif
typedef OUT_DTYPE out_t;
#if W_INT8
typedef signed char w_t;
#else
typedef bf16_t w_t;
#endif

constexpr int BM = 128, BN = 128, BK = 32, THREADS = 256;
constexpr int WARP_M = 64, WARP_N = 32;               // warp tile; warps arranged 2 x 4
constexpr int MT = WARP_M / 16, NT = WARP_N / 8;      // mma tiles per warp
constexpr int CHUNKS = BK / 8;                        // 16-byte chunks per tile row
constexpr int LOADS = BM * CHUNKS / THREADS;          // chunks per thread per tile (2)

__device__ __forceinline__ int swizzle(int row, int chunk) {
    return row * CHUNKS + (chunk ^ ((row >> 1) & 3));
}

// Eight bf16 of W (row n, k .. k + 8) as one uint4 of bf16 pairs; zeros when out of range.
__device__ __forceinline__ uint4 load_w8(const w_t* w, int n, int k, int N, int K) {
    if (n >= N || k >= K) return make_uint4(0, 0, 0, 0);
#if W_INT8
    uint2 raw = *reinterpret_cast<const uint2*>(w + (i64)n * K + k);
    uint4 r;
    weight8x4_to_bf16x2(raw.x, r.x, r.y);
    weight8x4_to_bf16x2(raw.y, r.z, r.w);
    return r;
#else
    return *reinterpret_cast<const uint4*>(w + (i64)n * K + k);
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS)
gemm(out_t* __restrict__ out, const bf16_t* __restrict__ x, const w_t* __restrict__ w,
     const float* __restrict__ w_scale, int M, int N, int K, i64 x_stride) {
    __shared__ uint4 smem_a[2][BM * CHUNKS];
    __shared__ uint4 smem_b[2][BN * CHUNKS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int warp_m = warp >> 2, warp_n = warp & 3;
    const int block_m = blockIdx.y * BM, block_n = blockIdx.x * BN;

    uint4 next_a[LOADS], next_b[LOADS];
    auto load_tile = [&](int k0) {
#pragma unroll
        for (int i = 0; i < LOADS; ++i) {
            const int id = tid + i * THREADS, row = id / CHUNKS, k = k0 + (id % CHUNKS) * 8;
            const int m = block_m + row;
            next_a[i] = (m < M && k < K) ? *reinterpret_cast<const uint4*>(x + (i64)m * x_stride + k)
                                         : make_uint4(0, 0, 0, 0);
            next_b[i] = load_w8(w, block_n + row, k, N, K);
        }
    };
    auto store_tile = [&](int buf) {
#pragma unroll
        for (int i = 0; i < LOADS; ++i) {
            const int id = tid + i * THREADS, row = id / CHUNKS, chunk = id % CHUNKS;
            smem_a[buf][swizzle(row, chunk)] = next_a[i];
            smem_b[buf][swizzle(row, chunk)] = next_b[i];
        }
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    const int k_tiles = (K + BK - 1) / BK;
    load_tile(0);
    store_tile(0);
    __syncthreads();
    for (int kt = 0; kt < k_tiles; ++kt) {
        const int buf = kt & 1;
        if (kt + 1 < k_tiles) load_tile((kt + 1) * BK);
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) {
            u32 a[MT][4], b[NT][2];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int row = warp_m * WARP_M + mt * 16 + (lane & 15);
                const int chunk = ks * 2 + (lane >> 4);
                ldmatrix_x4(a[mt][0], a[mt][1], a[mt][2], a[mt][3],
                            smem_addr(&smem_a[buf][swizzle(row, chunk)]));
            }
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                const int row = warp_n * WARP_N + np * 16 + (lane & 7) + ((lane >> 4) << 3);
                const int chunk = ks * 2 + ((lane >> 3) & 1);
                ldmatrix_x4(b[2 * np][0], b[2 * np][1], b[2 * np + 1][0], b[2 * np + 1][1],
                            smem_addr(&smem_b[buf][swizzle(row, chunk)]));
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    mma_bf16_16816(acc[mt][nt], a[mt][0], a[mt][1], a[mt][2], a[mt][3], b[nt][0], b[nt][1]);
        }
        if (kt + 1 < k_tiles) store_tile(buf ^ 1);
        __syncthreads();
    }

    // acc[mt][nt][0..1]: row g, cols 2t, 2t + 1; [2..3]: row g + 8.
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int h = 0; h < 4; ++h) {
                const int m = block_m + warp_m * WARP_M + mt * 16 + g + (h >> 1) * 8;
                const int n = block_n + warp_n * WARP_N + nt * 8 + 2 * t + (h & 1);
                if (m >= M || n >= N) continue;
                float v = acc[mt][nt][h];
#if W_INT8
                v *= w_scale[n];
#endif
                if (ROUND_BF16) v = round_to<bf16_t>(v);
                out[(i64)m * N + n] = from_float<out_t>(v);
            }
}
