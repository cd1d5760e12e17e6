// attention_decode.cu's compile-time parameters: their defaults and the constants they give.
// Included by attention_decode.cu first, after common.cuh.
//
// Defines: HEAD_DIM (a multiple of 64, at most 256), KV_INT8 (0/1), SMOOTH (0/1), KV_STAGES
// (ring depth >= 1), M_TILES (16-row m-tiles per warp: 1 or 2), PDL_TRIGGER (0/1),
// FUSED_INPUTS (0/1), MIN_SPLIT_TILES (>= 1), COMBINE_BATCH (attention_tiles.cuh), NORM_DTYPE
// (q/k norm weights' type), SPLIT_KEYS (0, or a multiple of 64: the batch-invariant partition).
#pragma once

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef KV_INT8
#define KV_INT8 0
#endif
#ifndef SMOOTH
#define SMOOTH 0
#endif
#ifndef KV_STAGES
#define KV_STAGES 3
#endif
#ifndef M_TILES
#define M_TILES 2
#endif
#ifndef PDL_TRIGGER
#define PDL_TRIGGER 0
#endif
#ifndef FUSED_INPUTS
#define FUSED_INPUTS 0
#endif
#ifndef MIN_SPLIT_TILES
#define MIN_SPLIT_TILES 1
#endif
#ifndef SPLIT_KEYS
#define SPLIT_KEYS 0
#endif
#ifndef NORM_DTYPE
#define NORM_DTYPE bf16_t
#endif

constexpr int BN = 64, WARPS = 4, THREADS = WARPS * 32;
constexpr int KEYS = BN / WARPS;  // keys of each tile per warp
constexpr int BM = 16 * M_TILES;  // packed query rows per block
constexpr u32 FULL = 0xffffffffu;
static_assert(KV_STAGES >= 1 && (M_TILES == 1 || M_TILES == 2), "defines");
static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM <= 256, "head_dim");
