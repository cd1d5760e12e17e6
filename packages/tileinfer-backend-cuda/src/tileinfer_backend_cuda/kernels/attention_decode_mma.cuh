// attention_decode.cu's tensor-core products over one warp's 16 keys of a ring stage, for every
// m-tile of its query rows: S = Q K^T (bf16 pages; INT8 pages: the int32 sums) and, for bf16
// pages, O += P V (INT8 pages' stays in the kernel: as a function it compiled to other code).
// Included by attention_decode.cu after attention_decode_smem.cuh.
#pragma once

#if KV_INT8
// S = Q K^T on int8 tensor cores, straight from the copied pages: the int32 sums of the hi and
// lo query parts times the keys (32 dims a k-step); the kernel scales them.
__device__ __forceinline__ void scores_int8(int (&s_int)[2][M_TILES][2][4],
                                            const SharedTiles& sm, const WarpSlice& in,
                                            int m_tiles, int lane) {
#pragma unroll
    for (int part = 0; part < 2; ++part)
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
            for (int j = 0; j < 2; ++j)
                s_int[part][mt][j][0] = s_int[part][mt][j][1] = s_int[part][mt][j][2] = s_int[part][mt][j][3] = 0;
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 32; ++kk) {
        u32 kf[2][2];  // B fragments of keys 0-7 and 8-15, dims 32 kk .. + 31
        const int key = (lane & 7) + ((lane >> 4) << 3), c = kk * 2 + ((lane >> 3) & 1);
        ldmatrix_x4(kf[0][0], kf[0][1], kf[1][0], kf[1][1], smem_addr(&in.k_raw[raw_chunk(key, c)]));
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
            if (mt >= m_tiles) break;
#pragma unroll
            for (int part = 0; part < 2; ++part) {
                u32 a0, a1, a2, a3;
                const int r = mt * 16 + (lane & 15), cq = kk * 2 + (lane >> 4);
                ldmatrix_x4(a0, a1, a2, a3, smem_addr(&sm.q8[part][raw_chunk(r, cq)]));
                mma_s8_16832(s_int[part][mt][0], a0, a1, a2, a3, kf[0][0], kf[0][1]);
                mma_s8_16832(s_int[part][mt][1], a0, a1, a2, a3, kf[1][0], kf[1][1]);
            }
        }
    }
}
#else
// S = Q K^T on bf16 tensor cores (with SMOOTH the query's hi and lo parts, Q_PARTS of them).
__device__ __forceinline__ void scores_bf16(float (&s)[M_TILES][2][4], const SharedTiles& sm,
                                            const uint4* k_tile, int m_tiles, int lane) {
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
        u32 kf[2][2];  // B fragments of keys 0-7 and 8-15, dims kk * 16 .. + 15
        const int key = (lane & 7) + ((lane >> 4) << 3), c = kk * 2 + ((lane >> 3) & 1);
        ldmatrix_x4(kf[0][0], kf[0][1], kf[1][0], kf[1][1], smem_addr(&k_tile[tile_chunk(key, c)]));
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
            if (mt >= m_tiles) break;
#pragma unroll
            for (int part = 0; part < Q_PARTS; ++part) {
                u32 a0, a1, a2, a3;
                const int r = mt * 16 + (lane & 15), cq = kk * 2 + (lane >> 4);
                ldmatrix_x4(a0, a1, a2, a3, smem_addr(&sm.q[part][tile_chunk(r, cq)]));
                mma_bf16_16816(s[mt][0], a0, a1, a2, a3, kf[0][0], kf[0][1]);
                mma_bf16_16816(s[mt][1], a0, a1, a2, a3, kf[1][0], kf[1][1]);
            }
        }
    }
}

// O += P V: k = the warp's 16 keys, n = HEAD_DIM (the V fragments shared by the m-tiles).
__device__ __forceinline__ void pv_bf16(float (&o_acc)[M_TILES][HEAD_DIM / 8][4],
                                        const u32 (&p_frag)[M_TILES][4], const uint4* v_tile,
                                        int m_tiles, int lane) {
#pragma unroll
    for (int dp = 0; dp < HEAD_DIM / 16; ++dp) {
        u32 b0, b1, b2, b3;
        const int key = (lane & 7) + ((lane >> 3) & 1) * 8, c = dp * 2 + (lane >> 4);
        ldmatrix_x4_trans(b0, b1, b2, b3, smem_addr(&v_tile[tile_chunk(key, c)]));
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
            if (mt >= m_tiles) break;
            const u32* a = p_frag[mt];
            mma_bf16_16816(o_acc[mt][2 * dp], a[0], a[1], a[2], a[3], b0, b1);
            mma_bf16_16816(o_acc[mt][2 * dp + 1], a[0], a[1], a[2], a[3], b2, b3);
        }
    }
}
#endif
