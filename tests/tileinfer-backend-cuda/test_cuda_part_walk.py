"""gemv_parts.cuh, the order of a batch-invariant row's sum (which K steps each part adds), run
on the host: the header's functions are plain integer arithmetic, so the system's C++ compiler
builds them with the device qualifiers defined away. For every layout, 1..16 parts and 0..200
steps: each step belongs to exactly one part, each part's steps ascend, ``part_next`` steps
from one to the next, ``PartWalk`` (gemm_invariant.cu's walk) visits the parts' steps in part
order, and the interleaved layout of one-step chunks is the dealing ``p, p + parts, ...``."""

from __future__ import annotations

import pytest

from host_check import run_host_check

CHECK = r"""
#include <algorithm>
#include <cstdio>
#include <vector>
using std::max; using std::min;
#define __device__
#define __forceinline__ inline
#include "gemv_parts.cuh"
int main() {
    int bad = 0;
    for (int parts = 1; parts <= 16; ++parts)
    for (int steps = 0; steps <= 200; ++steps) {
        std::vector<int> seen(steps, 0), in_order;
        int total = 0;
        for (int p = 0; p < parts; ++p) {
            const int n = part_steps(p, steps, parts);
            total += n;
            for (int i = 0, prev = -1; i < n; ++i) {
                const int s = part_step(p, i, steps, parts);
                if (s < 0 || s >= steps || s <= prev) { ++bad; break; }
                if (i > 0 && part_next(prev, parts) != s) ++bad;
#if !BLOCKED_PARTS && PART_CHUNK == 1
                if (s != p + i * parts) ++bad;
#endif
                ++seen[s];
                in_order.push_back(s);
                prev = s;
            }
        }
        if (total != steps) ++bad;
        for (int s = 0; s < steps; ++s) bad += seen[s] != 1;
        PartWalk walk{0, 0, 0};
        walk.enter(parts, steps, parts);
        for (int s : in_order) {
            if (walk.step != s) { ++bad; break; }
            walk.advance(parts, steps, parts);
        }
        if (walk.part != parts) ++bad;
    }
    std::printf("%d\n", bad);
    return bad != 0;
}
"""


@pytest.mark.parametrize("blocked,chunk", [(0, 1), (0, 2), (0, 4), (0, 8), (1, 1)],
                         ids=["interleaved", "chunk2", "chunk4", "chunk8", "blocked"])
def test_every_k_step_is_one_parts_in_walk_order(tmp_path, blocked, chunk):
    run_host_check(tmp_path, CHECK, f"-DBLOCKED_PARTS={blocked}", f"-DPART_CHUNK={chunk}")
