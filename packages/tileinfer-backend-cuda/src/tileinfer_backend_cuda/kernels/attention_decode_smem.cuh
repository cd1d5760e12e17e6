// attention_decode.cu's shared memory and query tile for INT8 pages: the K/V ring's layout, the
// block's SharedTiles (ops/attention.py's attention_decode_smem_bytes mirrors it), and the
// quantized query rows. Included by attention_decode.cu after its defines and constants.
#pragma once

// LOAD_CHUNKS (a key row's 16-byte chunks) is 4..32, so they divide a warp.
constexpr int KEY_STEP = 32 / LOAD_CHUNKS;  // keys the warp's lanes copy at once
constexpr int LOADS = KEYS / KEY_STEP;      // copies per lane per tile, for K and for V

#if KV_INT8
// Rows of HEAD_DIM int8 (cached keys and values, the quantized query) are RAW_CHUNKS 16-byte
// chunks; chunk c of row r lives at chunk c ^ f(r) of the row, so that the 8 rows an ldmatrix
// reads hit 8 different bank groups: f(r) = r % 8 where a row is a multiple of 128 bytes, else
// (a row of 64 or 192 bytes, two rows per 128) (r / 2) % 4.
constexpr int RAW_CHUNKS = HEAD_DIM / 16;
__device__ __forceinline__ int raw_chunk(int row, int chunk) {
    return row * RAW_CHUNKS + (chunk ^ (RAW_CHUNKS % 8 == 0 ? (row & 7) : ((row >> 1) & 3)));
}
// The quantized query (see store_query_row_int8): |256 hi + lo| <= Q_INT_MAX = 127 * 256.
constexpr float Q_INT_MAX = 32512.0f;
#endif

struct WarpSlice {  // one warp's 16 keys of one ring stage
#if KV_INT8
    uint4 k_raw[KEYS * RAW_CHUNKS];  // int8 rows as copied, key-major (swizzled: raw_chunk)
    uint4 v_raw[KEYS * RAW_CHUNKS];
    float k_scale[KEYS];
    float v_scale[KEYS];
#else
    uint4 k[KEYS * CHUNKS];  // bf16 rows, copied in place (swizzled)
    uint4 v[KEYS * CHUNKS];
#endif
};

struct Ring {
    WarpSlice stage[KV_STAGES][WARPS];
};

struct SharedTiles {
#if KV_INT8
    uint4 q8[2][BM * RAW_CHUNKS];  // the query tile as int8 hi and lo parts (swizzled: raw_chunk)
    float q_scale[BM];             // ... and each row's scale
#else
    uint4 q[Q_PARTS][BM * CHUNKS];
#endif
    float row_max[WARPS][BM];  // each warp's softmax state at the end
    float row_sum[WARPS][BM];
    union {
        Ring ring;
        float o[WARPS][BM * HEAD_DIM];  // each warp's O after the loop (8-float groups swizzled)
    };
};

#ifdef SMEM_BYTES  // test_cuda_compile.py: ops/attention.py's attention_decode_smem_bytes
static_assert(sizeof(SharedTiles) == SMEM_BYTES, "ops.attention_decode_smem_bytes != sizeof(SharedTiles)");
#endif

// Float index of (row, col) in a warp's O: 8-float groups XOR (row % 4), so that the float2
// stores of rows g = 0..7 spread over all banks.
__device__ __forceinline__ int o_index(int row, int col) {
    return row * HEAD_DIM + (col ^ ((row & 3) << 3));
}

#if KV_INT8
// Row r of the query tile for INT8 pages, by one warp, from the row's bf16 values at src (lane l
// reads elements 8l .. 8l + 7; nullptr: a row of zeros): x = q * smooth (float32; smooth: the
// kv head's key smoothing factors, or none) is quantized so that Q K^T runs on int8 tensor cores
// with the cached int8 keys, exactly: x ~ scale * (256 * hi + lo), integers hi in [-127, 127] and
// lo in [-128, 127], scale = max |x| / Q_INT_MAX. Each element is within scale / 2 = 2^-16 max |x|
// of x (the bf16 query itself carries 2^-9 of each element).
__device__ __forceinline__ void store_query_row_int8(SharedTiles& sm, const bf16_t* src,
                                                     const float* k_smooth, int kvh, int r,
                                                     int lane) {
    float x[8];
    const bool mine = lane < CHUNKS;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (mine && src != nullptr) raw = *reinterpret_cast<const uint4*>(src + lane * 8);
    const u32* w = reinterpret_cast<const u32*>(&raw);
    float largest = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        x[e] = e % 2 ? bf16_hi(w[e / 2]) : bf16_lo(w[e / 2]);
#if SMOOTH
        if (mine) x[e] *= k_smooth[kvh * HEAD_DIM + lane * 8 + e];
#endif
        largest = fmaxf(largest, fabsf(x[e]));
    }
    largest = warp_max(largest);
    const float inv = largest > 0.0f ? Q_INT_MAX / largest : 0.0f;
    u32 hi[2] = {0, 0}, lo[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int v = __float2int_rn(x[e] * inv);  // |v| <= Q_INT_MAX
        const int h = (v + 128) >> 8;              // floor: v - 256 h in [-128, 127]
        hi[e / 4] |= (u32)(h & 0xff) << (8 * (e % 4));
        lo[e / 4] |= (u32)((v - 256 * h) & 0xff) << (8 * (e % 4));
    }
    if (mine) {
        reinterpret_cast<uint2*>(&sm.q8[0][raw_chunk(r, lane >> 1)])[lane & 1] = make_uint2(hi[0], hi[1]);
        reinterpret_cast<uint2*>(&sm.q8[1][raw_chunk(r, lane >> 1)])[lane & 1] = make_uint2(lo[0], lo[1]);
    }
    if (lane == 0) sm.q_scale[r] = largest / Q_INT_MAX;
}
#endif
