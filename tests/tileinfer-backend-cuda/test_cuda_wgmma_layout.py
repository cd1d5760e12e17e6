"""gemm_wgmma_layout.cuh run on the host: the copies' placement (``wgmma_chunk``,
``wgmma_cell``) against the descriptors gemm_wgmma.cu hands wgmma (``wgmma_operand``), read the
way the PTX ISA describes a K-major operand with the 128-byte swizzle: the descriptor's start
address and stride byte offset (SBO) in 16-byte units in bits 0-13 and 32-45, layout type 1 in
bits 62-63, and element (m, k) of the 64- or N-row operand at swizzle(start + (m / 8) SBO +
(m % 8) 128 + 2 k), where the swizzle XORs address bits 4-6 with bits 7-9 (the leading byte
offset is not read: the product's 32 bytes of a row lie inside its 128). Each row's chunks are
labelled row * 64 + k as the copies place them; every product (k 16 kk .. 16 kk + 15) of every
warpgroup's rows and of the tokens must read the labels of its own rows and k; the copies must
cover each row's 8 chunks once, and a quarter warp's 8 copies must land in 8 different 16-byte
bank groups. And ``wgmma_steps``' walk (a block's steps in order, a part closed before the first
step of a later one, empty parts closed too) must be gemm_invariant.cu's walk over
gemv_parts.cuh's contiguous parts, event by event."""

from __future__ import annotations

import pytest

from host_check import run_host_check

CHECK = r"""
#include <algorithm>
#include <cstdint>
#include <cstdio>
typedef uint32_t u32;
using std::min;
#define __device__
#define __forceinline__ inline
#include "gemm_wgmma_layout.cuh"

static uint16_t smem[64 * 1024];  // bf16 elements

int check(int rows, int groups) {  // a region of `rows` rows, read `groups` x 64 rows at a time
    int bad = 0;
    static int placed[256][8];
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 8; ++c) placed[r][c] = 0;
    for (int q = 0; q < rows * 8; ++q) {
        const WgmmaChunk w = wgmma_chunk(q);
        if (w.row < 0 || w.row >= rows || w.chunk < 0 || w.chunk >= 8) { ++bad; continue; }
        ++placed[w.row][w.chunk];
        for (int e = 0; e < 8; ++e)
            smem[wgmma_cell(w.row, w.chunk) / 2 + e] =
                (uint16_t)(w.row * 64 + 8 * w.chunk + e);
    }
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < 8; ++c) bad += placed[r][c] != 1;
    for (int q0 = 0; q0 < rows * 8; q0 += 8) {  // a quarter warp's copies
        int used = 0;
        for (int q = q0; q < q0 + 8; ++q) {
            const WgmmaChunk w = wgmma_chunk(q);
            used |= 1 << (wgmma_cell(w.row, w.chunk) / 16 % 8);
        }
        bad += used != 0xff;
    }
    const int span = groups ? 64 : rows;  // the rows one operand covers
    for (int row0 = 0; row0 < rows; row0 += span)
        for (int kk = 0; kk < 4; ++kk) {
            const unsigned long long d = wgmma_operand(0, kk, row0);
            const u32 start = (u32)(d & 0x3FFF) * 16, sbo = (u32)(d >> 32 & 0x3FFF) * 16;
            bad += (int)(d >> 62) != 1 || (int)(d >> 49 & 7) != 0;  // 128-byte swizzle, aligned
            for (int m = 0; m < span; ++m)
                for (int k = 0; k < 16; ++k) {
                    const u32 plain = start + m / 8 * sbo + m % 8 * 128 + 2 * k;
                    const u32 at = plain ^ ((plain >> 7 & 7) << 4);
                    bad += smem[at / 2] != (uint16_t)((row0 + m) * 64 + 16 * kk + k);
                }
        }
    return bad;
}

int main() {
    printf("%d\n", check(ROWS, GROUPS));
    return 0;
}
"""


@pytest.mark.parametrize("rows,groups", [(64, 1), (128, 1), (64, 0), (32, 0)],
                         ids=["weights-wg1", "weights-wg2", "tokens-64", "tokens-32"])
def test_descriptors_read_what_the_copies_placed(tmp_path, rows, groups):
    run_host_check(tmp_path, CHECK, f"-DROWS={rows}", f"-DGROUPS={groups}")


WALK = r"""
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>
typedef uint32_t u32;
using std::max;
using std::min;
#define __device__
#define __forceinline__ inline
#define BLOCKED_PARTS 1
#include "gemv_parts.cuh"
#include "gemm_wgmma_layout.cuh"

// Events of a block's walk over the parts [lo, hi): step s as s, part p closed as -1 - p.
std::vector<int> wgmma_walk(int lo, int hi, int steps, int parts) {
    std::vector<int> ev;
    const WgmmaSteps w = wgmma_steps(lo, hi, steps, parts);
    int next = lo;
    auto close = [&](int upto) { for (; next < upto; ++next) ev.push_back(-1 - next); };
    for (int s = w.first; s < w.last; ++s) {
        close(s / w.per);
        ev.push_back(s);
    }
    close(hi);
    return ev;
}
std::vector<int> invariant_walk(int lo, int hi, int steps, int parts) {  // gemm_invariant.cu's
    std::vector<int> ev;
    int total = 0, next = lo;
    for (int p = lo; p < hi; ++p) total += part_steps(p, steps, parts);
    PartWalk read{lo, 0, 0};
    read.enter(hi, steps, parts);
    auto close = [&](int upto) { for (; next < upto; ++next) ev.push_back(-1 - next); };
    for (int i = 0; i < total; ++i) {
        close(read.part);
        ev.push_back(read.step);
        read.advance(hi, steps, parts);
    }
    close(hi);
    return ev;
}
int main() {
    int bad = 0;
    for (int steps = 1; steps <= 40; ++steps)
        for (int parts : {1, 2, 4, 8, 16})
            for (int runs : {1, 2, 4})
                if (parts % runs == 0)
                    for (int r = 0; r < runs; ++r) {
                        const int lo = r * parts / runs, hi = (r + 1) * parts / runs;
                        bad += wgmma_walk(lo, hi, steps, parts) != invariant_walk(lo, hi, steps,
                                                                                  parts);
                    }
    printf("%d\n", bad);
    return 0;
}
"""


def test_the_walk_over_k_is_gemm_invariant_s(tmp_path):
    run_host_check(tmp_path, WALK)
