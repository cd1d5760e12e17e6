// Do Hopper's wgmma and mma.sync add a chain of 16-wide bf16 products to the same float32 bits?
// gemv.cu's batch-invariant order is a chain of mma.sync m16n8k16 products per part; a GEMM on
// wgmma (what cuBLAS uses for batched steps) could keep that order only if the answer is yes.
//
// Five kernels compute D (64 x 16, float32) = A (64 x K) . B (16 x K)^T as chains of K / 16
// products from zero, each on the same 16 k of A and B:
//   mma       mma.sync.m16n8k16 (4 warps, 16 rows each, two token tiles), k in order;
//   mma_perm  the same, the 16 k of each product placed in a permuted order (the same for A and
//             B): whether the order inside one product changes the bits;
//   wgmma_n8  wgmma.mma_async.m64n8k16 (one warpgroup) per token tile, A from registers in
//             mma.sync's fragment layout, B from shared memory (K-major, no swizzle);
//   wgmma_n16 one wgmma.mma_async.m64n16k16 chain for both token tiles (two core matrices in N:
//             the descriptor's two strides both in use);
//   swapped   mma.sync with the operands' roles swapped (the 16 tokens as A's rows, 8 weight rows
//             as B's columns): whether a GEMM may put either matrix in either operand.
// It prints, per input set (bf16 values of several exponent ranges), how many of the 1,024
// outputs differ in their bits from mma's, and each kernel's largest error against a float64 sum
// (a layout mistake shows as a large error, not as a few bits).
//
//   nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/wgmma_bits \
//       benchmarks/wgmma_bits.cu && /tmp/wgmma_bits
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

typedef uint16_t bf16;
typedef uint32_t u32;

constexpr int M = 64, N = 16, K = 1024, CHUNKS = K / 16;  // B: 32 KB of shared memory

// Logical k -> physical k within a product (mma_perm): a fixed shuffle of 0..15.
__constant__ int PERM[16] = {5, 12, 0, 9, 14, 3, 7, 10, 1, 15, 6, 11, 2, 8, 13, 4};

__device__ __forceinline__ u32 pack(const bf16* row, int k, const int* perm) {
    const int k0 = perm ? (k / 16) * 16 + perm[k % 16] : k;
    const int k1 = perm ? (k / 16) * 16 + perm[(k + 1) % 16] : k + 1;
    return (u32)row[k0] | ((u32)row[k1] << 16);
}

// mma.sync's fragments of chunk c for lane (g, t) of warp w: A rows 16w + g (+ 8), B token
// 8j + g (token tile j).
__device__ __forceinline__ void fragments(const bf16* A, const bf16* B, int c, const int* perm,
                                          int j, u32 (&a)[4], u32 (&b)[2]) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const bf16* r0 = A + (size_t)(16 * w + g) * K;
    const bf16* r1 = r0 + 8 * K;
    const int k = 16 * c + 2 * t;
    a[0] = pack(r0, k, perm), a[1] = pack(r1, k, perm);
    a[2] = pack(r0, k + 8, perm), a[3] = pack(r1, k + 8, perm);
    const bf16* x = B + (size_t)(8 * j + g) * K;
    b[0] = pack(x, k, perm), b[1] = pack(x, k + 8, perm);
}

// Accumulator layout of token tile j (both instructions): rows 16w + g (d0, d1) and + 8 (d2,
// d3), tokens 8j + 2t, + 1.
__device__ __forceinline__ void store(float* D, const float* d, int j) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int r = 16 * w + g, n = 8 * j + 2 * t;
    D[r * N + n] = d[0], D[r * N + n + 1] = d[1];
    D[(r + 8) * N + n] = d[2], D[(r + 8) * N + n + 1] = d[3];
}

__global__ void mma_chain(float* D, const bf16* A, const bf16* B, int permuted) {
    const int* perm = permuted ? PERM : nullptr;
    for (int j = 0; j < N / 8; ++j) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        for (int c = 0; c < CHUNKS; ++c) {
            u32 a[4], b[2];
            fragments(A, B, c, perm, j, a, b);
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
        }
        store(D, d, j);
    }
}

// D^T = B A^T on mma.sync: warp w takes the weight rows 16w .. 16w + 15 as two 8-column tiles,
// the 16 tokens as the 16 rows.
__global__ void swapped_chain(float* D, const bf16* A, const bf16* B) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    for (int j = 0; j < 2; ++j) {
        const int row0 = 16 * w + 8 * j;  // this tile's first weight row
        float d[4] = {0.f, 0.f, 0.f, 0.f};
        for (int c = 0; c < CHUNKS; ++c) {
            const int k = 16 * c + 2 * t;
            const bf16* x0 = B + (size_t)g * K;
            const bf16* x1 = x0 + 8 * K;
            const bf16* wr = A + (size_t)(row0 + g) * K;
            const u32 a0 = pack(x0, k, nullptr), a1 = pack(x1, k, nullptr);
            const u32 a2 = pack(x0, k + 8, nullptr), a3 = pack(x1, k + 8, nullptr);
            const u32 b0 = pack(wr, k, nullptr), b1 = pack(wr, k + 8, nullptr);
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        }
        // d: tokens g (d0, d1) and g + 8 (d2, d3), weight rows row0 + 2t, + 1
        D[(row0 + 2 * t) * N + g] = d[0], D[(row0 + 2 * t + 1) * N + g] = d[1];
        D[(row0 + 2 * t) * N + g + 8] = d[2], D[(row0 + 2 * t + 1) * N + g + 8] = d[3];
    }
}

// B in shared memory, K-major without swizzle, in core matrices of 8 tokens x 8 k (16 bytes a
// token, 128 bytes a matrix): chunk c at c * 512 bytes, then token tile nb at nb * 256 (the
// stride between core matrices along N: SBO), then k half at half * 128 (along K: LBO).
__device__ __forceinline__ uint64_t b_desc(u32 addr) {
    const uint64_t lbo = 128 >> 4, sbo = 256 >> 4;
    return (uint64_t)((addr >> 4) & 0x3FFF) | (lbo << 16) | (sbo << 32);  // swizzle bits 0: none
}

// wgmma's D += A B with A from registers, for token tiles of 8 (n8) or 16 (n16) tokens.
__device__ __forceinline__ void wgmma_n8(float* d, const u32 (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"  // p: D += A B (not D = A B)
        "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

__device__ __forceinline__ void wgmma_n16(float* d, const u32 (&a)[4], uint64_t desc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, "
        "{%8,%9,%10,%11}, %12, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));
}

__global__ void wgmma_chain(float* D, const bf16* A, const bf16* B, int n16) {
    __shared__ alignas(128) bf16 sb[CHUNKS * 256];
    for (int i = threadIdx.x; i < N * K; i += blockDim.x) {
        const int n = i / K, k = i % K, c = k / 16, half = (k % 16) / 8;
        sb[c * 256 + (n / 8) * 128 + half * 64 + (n % 8) * 8 + k % 8] = B[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const u32 base = (u32)__cvta_generic_to_shared(sb);
    float d[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int c = 0; c < CHUNKS; ++c) {
        u32 a[4], b[2];
        fragments(A, B, c, nullptr, 0, a, b);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        if (n16) {
            wgmma_n16(d, a, b_desc(base + c * 512));
        } else {
            wgmma_n8(d, a, b_desc(base + c * 512));
            wgmma_n8(d + 4, a, b_desc(base + c * 512 + 256));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    store(D, d, 0);
    store(D, d + 4, 1);
}

static float bf16_to_float(bf16 v) {
    u32 bits = (u32)v << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

static bf16 float_to_bf16(float f) {  // round to nearest even
    u32 bits;
    std::memcpy(&bits, &f, 4);
    return (bf16)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// Normal values times 2^e, e uniform in [-spread, spread] (a wide spread stresses the alignment of
// the products inside one instruction).
static void fill(std::vector<bf16>& v, uint64_t seed, int spread) {
    uint64_t s = seed;
    auto next = [&]() {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        return (double)(s >> 11) / 9007199254740992.0;
    };
    for (auto& x : v) {
        const double u1 = next() + 1e-12, u2 = next();
        const double z = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
        const int e = spread ? (int)(next() * (2 * spread + 1)) - spread : 0;
        x = float_to_bf16((float)std::ldexp(z, e));
    }
}

int main() {
    constexpr int KERNELS = 5;
    const char* names[KERNELS] = {"mma", "mma_perm", "wgmma_n8", "wgmma_n16", "swapped"};
    std::vector<bf16> A(M * K), B(N * K);
    bf16 *dA, *dB;
    float* dD;
    cudaMalloc(&dA, A.size() * 2);
    cudaMalloc(&dB, B.size() * 2);
    cudaMalloc(&dD, KERNELS * M * N * 4);
    bool wgmma_equal = true, perm_equal = true, swap_equal = true;
    for (int spread : {0, 4, 12}) {
        for (uint64_t seed = 1; seed <= 3; ++seed) {
            fill(A, seed * 977 + spread, spread);
            fill(B, seed * 131 + spread + 7, spread);
            cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice);
            cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice);
            mma_chain<<<1, 128>>>(dD, dA, dB, 0);
            mma_chain<<<1, 128>>>(dD + M * N, dA, dB, 1);
            wgmma_chain<<<1, 128>>>(dD + 2 * M * N, dA, dB, 0);
            wgmma_chain<<<1, 128>>>(dD + 3 * M * N, dA, dB, 1);
            swapped_chain<<<1, 128>>>(dD + 4 * M * N, dA, dB);
            const cudaError_t err = cudaDeviceSynchronize();
            if (err != cudaSuccess) {
                std::printf("CUDA error: %s\n", cudaGetErrorString(err));
                return 2;
            }
            std::vector<float> D(KERNELS * M * N);
            cudaMemcpy(D.data(), dD, D.size() * 4, cudaMemcpyDeviceToHost);
            int differ[KERNELS] = {};
            double worst[KERNELS] = {};
            for (int i = 0; i < M * N; ++i) {
                const int r = i / N, n = i % N;
                double ref = 0, scale = 0;
                for (int k = 0; k < K; ++k) {
                    const double p =
                        (double)bf16_to_float(A[r * K + k]) * bf16_to_float(B[n * K + k]);
                    ref += p, scale += std::fabs(p);
                }
                for (int v = 0; v < KERNELS; ++v) {
                    const float out = D[v * M * N + i];
                    worst[v] = std::fmax(worst[v], std::fabs(out - ref) / (scale + 1e-30));
                    differ[v] += std::memcmp(&D[i], &out, 4) != 0;
                }
            }
            perm_equal &= differ[1] == 0;
            wgmma_equal &= differ[2] == 0 && differ[3] == 0;
            swap_equal &= differ[4] == 0;
            std::printf("spread 2^+-%-2d seed %d:", spread, (int)seed);
            for (int v = 0; v < KERNELS; ++v)
                std::printf("  %s %d differ, error %.1e", names[v], differ[v], worst[v]);
            std::printf("\n");
        }
    }
    std::printf("of %d outputs a set: wgmma %s mma.sync's bits; a product's k order %s them; "
                "swapping the operands %s them\n",
                M * N, wgmma_equal ? "equals" : "does NOT equal",
                perm_equal ? "does not change" : "CHANGES", swap_equal ? "keeps" : "CHANGES");
    return 0;
}
