// attention_decode.cu's end of the key loop: each warp's online-softmax state (m, l, O) to shared
// memory, then the states merged in warp order 0..3: M = max m_w, O = sum_w 2^(m_w - M) O_w,
// l = sum_w 2^(m_w - M) l_w, and O / l written (or the split's partial). Included by
// attention_decode.cu after attention_decode_smem.cuh.
#pragma once

// The warp's online-softmax state to shared memory, where the ring was: per row of its m-tiles
// the max, the sum (over the quad's columns) and O (INT8 pages: o_acc's dims as the kernel's
// O += P V lays them out).
__device__ __forceinline__ void store_warp_state(SharedTiles& sm, const float (&row_max)[M_TILES][2],
                                                 const float (&row_sum)[M_TILES][2],
                                                 const float (&o_acc)[M_TILES][HEAD_DIM / 8][4],
                                                 int m_tiles, int warp, int g, int t) {
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
        if (mt >= m_tiles) break;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = mt * 16 + g + 8 * h;
            float l = row_sum[mt][h];  // over the quad's columns
            l += __shfl_xor_sync(FULL, l, 1);
            l += __shfl_xor_sync(FULL, l, 2);
            if (t == 0) {
                sm.row_max[warp][r] = row_max[mt][h];
                sm.row_sum[warp][r] = l;
            }
#if KV_INT8
#pragma unroll
            for (int c = 0; c < HEAD_DIM / 16; ++c)  // dims 16c + 4t .. + 3 (see O += P V)
                *reinterpret_cast<float4*>(&sm.o[warp][o_index(r, c * 16 + 4 * t)]) =
                    make_float4(o_acc[mt][2 * c][2 * h], o_acc[mt][2 * c + 1][2 * h],
                                o_acc[mt][2 * c][2 * h + 1], o_acc[mt][2 * c + 1][2 * h + 1]);
#else
#pragma unroll
            for (int d = 0; d < HEAD_DIM / 8; ++d)
                *reinterpret_cast<float2*>(&sm.o[warp][o_index(r, d * 8 + 2 * t)]) =
                    make_float2(o_acc[mt][d][2 * h], o_acc[mt][d][2 * h + 1]);
#endif
        }
    }
}

// Merge the warps' states in warp order 0..3 and normalize: the tile's output rows, or with
// split-KV (split_mode) this split's normalized partial and its log-sum-exp. A thread per
// (row, 8 dims).
__device__ __forceinline__ void merge_warp_states(const SharedTiles& sm, bf16_t* __restrict__ out,
                                                  float* ws, bool split_mode, int split,
                                                  int ws_splits, int m_tiles, int m0, int rows,
                                                  int q_start, int group, int kvh, int heads,
                                                  int tid) {
    for (int id = tid; id < m_tiles * 16 * CHUNKS; id += THREADS) {
        const int r = id / CHUNKS, c = id % CHUNKS, rg = m0 + r;
        if (rg >= rows) break;  // later ids only have later rows
        float m = neg_inf();
#pragma unroll
        for (int w = 0; w < WARPS; ++w) m = fmaxf(m, sm.row_max[w][r]);
        const float base = m == neg_inf() ? 0.0f : m;
        float l = 0.0f, acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float f = exp2f(sm.row_max[w][r] - base);  // 0 for a warp that saw no key
            l += f * sm.row_sum[w][r];
            const float4* src = reinterpret_cast<const float4*>(&sm.o[w][o_index(r, c * 8)]);
            const float4 x0 = src[0], x1 = src[1];
            acc[0] += f * x0.x; acc[1] += f * x0.y; acc[2] += f * x0.z; acc[3] += f * x0.w;
            acc[4] += f * x1.x; acc[5] += f * x1.y; acc[6] += f * x1.z; acc[7] += f * x1.w;
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const i64 token = q_start + rg / group, head = kvh * group + rg % group;
        if (!split_mode) {
            uint4 v;
            v.x = pack_bf16x2(acc[0] * inv, acc[1] * inv);
            v.y = pack_bf16x2(acc[2] * inv, acc[3] * inv);
            v.z = pack_bf16x2(acc[4] * inv, acc[5] * inv);
            v.w = pack_bf16x2(acc[6] * inv, acc[7] * inv);
            *reinterpret_cast<uint4*>(out + (token * heads + head) * HEAD_DIM + c * 8) = v;
        } else {
            float* dst = ws + ((token * heads + head) * ws_splits + split) * WS_ROW;
#pragma unroll
            for (int e = 0; e < 4; ++e)  // float2: a workspace row is 8- but not 16-byte aligned
                *reinterpret_cast<float2*>(dst + c * 8 + 2 * e) =
                    make_float2(acc[2 * e] * inv, acc[2 * e + 1] * inv);
            if (c == 0) dst[HEAD_DIM] = l > 0.0f ? m + log2f(l) : neg_inf();
        }
    }
}
