"""gemv_nk.cuh (products of neighbouring k) run on the host: its cell placement and ldmatrix
addresses are integer arithmetic, so the system's C++ compiler builds them with the device
qualifiers defined away and ldmatrix simulated (lane i's address gives row i % 8 of matrix
i / 8; thread (g, t) receives 32-bit word t of row g of each matrix). Every lane's chunk of a
row (k 8t .. 8t + 7 of a 32-k step, rows g and g + 8, and of a token) is copied to its cell
(``nk_cell``), then ``nk_a`` and ``nk_b`` (at ``nk_lane``'s rows) must hand each thread the
mma fragments of product p = k 16p .. 16p + 15 in mma.m16n8k16's layout (a0: row g, k 2t,
2t + 1; a1: row g + 8; a2, a3: k + 8; b0: token g, k 2t, 2t + 1; b1: k + 8), and the eight rows
of every matrix must sit in eight different 16-byte bank groups. A wrong cell, swizzle or
matrix order fails here."""

from __future__ import annotations

from host_check import run_host_check

CHECK = r"""
#include <cstdint>
#include <cstdio>
typedef uint32_t u32;
#define __device__
#define __forceinline__ inline
#define W_INT8 0
#define W_FP8 0
#define NK_PRODUCTS 1
static uint16_t smem[2048];  // bf16 elements; a part is 32 cells of 8
static u32 seen[32][2];      // the addresses each lane gave its ldmatrix calls
static int calls[32], lane_now;
inline void ldmatrix_x4(u32& r0, u32& r1, u32& r2, u32& r3, u32 addr) {
    seen[lane_now][calls[lane_now]++] = addr;
    r0 = r1 = r2 = r3 = 0;
}
inline void mma_bf16_16816(float (&)[4], u32, u32, u32, u32, u32, u32) {}
#include "gemv_nk.cuh"

// A row's chunk t holds the labels row * 64 + k, k = 8t .. 8t + 7.
void fill(u32 part, int row0) {
    for (int g = 0; g < 8; ++g)
        for (int t = 0; t < 4; ++t)
            for (int e = 0; e < 8; ++e)
                smem[(part + nk_cell(g, t) * 16) / 2 + e] = (uint16_t)((row0 + g) * 64 + 8 * t + e);
}
// The word thread (g, t) receives from matrix m of ldmatrix call c: its two labels.
bool word_is(int c, int m, int g, int t, int row, int k) {
    const u32 addr = seen[8 * m + g][c];
    const uint16_t* w = &smem[addr / 2 + 2 * t];
    return w[0] == row * 64 + k && w[1] == row * 64 + k + 1;
}
int banks_bad(int c) {
    int bad = 0;
    for (int m = 0; m < 4; ++m) {
        int used = 0;
        for (int r = 0; r < 8; ++r) used |= 1 << (seen[8 * m + r][c] / 16 % 8);
        bad += used != 0xff;
    }
    return bad;
}
int main() {
    const u32 pa = 0, pb = 512, px = 1024;  // rows g, rows g + 8, tokens
    fill(pa, 0), fill(pb, 8), fill(px, 16);
    int bad = 0;
    for (int i = 0; i < 32; ++i) bad += nk_cell(i / 4, i % 4) < 0 || nk_cell(i / 4, i % 4) > 31;
    for (int i = 0; i < 32; ++i)
        for (int j = 0; j < i; ++j) bad += nk_cell(i / 4, i % 4) == nk_cell(j / 4, j % 4);
    for (lane_now = 0; lane_now < 32; ++lane_now) {
        u32 a[2][4];
        nk_a(a, pa, nk_lane(lane_now));  // rows g + 8: the next part, pb
    }
    for (int p = 0; p < 2; ++p) {
        bad += banks_bad(p);
        for (int g = 0; g < 8; ++g)
            for (int t = 0; t < 4; ++t) {
                const int k = 16 * p + 2 * t;
                bad += !word_is(p, 0, g, t, g, k) + !word_is(p, 1, g, t, 8 + g, k);
                bad += !word_is(p, 2, g, t, g, k + 8) + !word_is(p, 3, g, t, 8 + g, k + 8);
            }
    }
    for (lane_now = 0; lane_now < 32; ++lane_now) {
        u32 b[4];
        nk_b(b, px, nk_lane(lane_now));
    }
    bad += banks_bad(2);
    for (int c = 0; c < 4; ++c)  // b[c]: k 8c + 2t: product c / 2's b0 (c even) or b1
        for (int g = 0; g < 8; ++g)
            for (int t = 0; t < 4; ++t) bad += !word_is(2, c, g, t, 16 + g, 8 * c + 2 * t);
    std::printf("%d\n", bad);
    return bad != 0;
}
"""


def test_nk_fragments_are_mma_layouts_of_neighbouring_k(tmp_path):
    run_host_check(tmp_path, CHECK)
