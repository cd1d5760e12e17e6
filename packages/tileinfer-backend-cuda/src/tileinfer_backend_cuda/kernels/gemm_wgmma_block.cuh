// The block of gemm_wgmma.cu and gemm_wgmma_ws.cu (included after common.cuh and a kernel's own
// defines): the shared defines' defaults and checks, the shapes they give a block and a stage
// of its ring (gemm_wgmma.cu's header says what each means), and the ring's layout.
#pragma once

#define W_INT8 0
#ifndef W_FP8
#define W_FP8 0  // 1: e4m3 weights and tokens (gemm_wgmma.cu's header)
#endif
#ifndef EPILOGUE
#define EPILOGUE 0
#endif
#ifndef OUT_DTYPE
#define OUT_DTYPE bf16_t
#endif
#ifndef ROUND_BF16
#define ROUND_BF16 1
#endif
#ifndef PARTS
#define PARTS 8
#endif
#ifndef RUNS
#define RUNS 1
#endif
#ifndef WG
#define WG 1
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef NT
#define NT 8
#endif
#ifndef TG
#define TG 1
#endif
#ifndef PDL
#define PDL 0
#endif
typedef OUT_DTYPE out_t;
static_assert(PARTS % RUNS == 0, "RUNS: runs of whole parts");
static_assert(STAGES >= 2, "a stage in products and one being filled");
static_assert(NT == 4 || NT == 8, "NT: wgmma's n32 or n64");
static_assert(TG == 1 || TG == 2 || TG == 4, "TG: 1, 2 or 4 token groups");

constexpr int MATS = EPILOGUE == 1 ? 2 : 1;  // weight matrices: gate (and up)
// A block's weight rows (of each matrix), its products' threads and its tokens.
constexpr int BLOCK_ROWS = 64 * WG, THREADS = 128 * WG * TG, TOKENS = 8 * NT * TG;
constexpr int TOKEN_GROUPS = TG;  // gemm_store.cuh: a warp's tokens from 8 NT (warp / 4 WG)
constexpr int ROW_TILES = 1, WARP_ROWS = 16, WT = MATS;  // a warp's tiles (gemm_store.cuh)
constexpr int W_ROWS = MATS * BLOCK_ROWS;  // a stage's weight rows: matrix m's from m BLOCK_ROWS
constexpr int PER_RUN = PARTS / RUNS;  // gemm_store.cuh's
constexpr int W_STAGE = W_ROWS * 128, STAGE_BYTES = W_STAGE + TOKENS * 128;  // 64 k a row

#include "gemm_wgmma_layout.cuh"  // WGMMA_ALIGN, wgmma_cell, wgmma_chunk, wgmma_operand, ..
static_assert(W_STAGE % WGMMA_ALIGN == 0 && STAGE_BYTES % WGMMA_ALIGN == 0,
              "every region of every stage on a period of the swizzle");

