"""gemv_parts.cuh, the order of a batch-invariant row's sum (which K steps each part adds), run
on the host: the header's functions are plain integer arithmetic, so the system's C++ compiler
builds them with the device qualifiers defined away. For every layout, 1..16 parts and 0..200
steps: each step belongs to exactly one part, each part's steps ascend, ``part_next`` steps
from one to the next, ``PartWalk`` (gemm_invariant.cu's walk) visits the parts' steps in part
order, and the interleaved layout of one-step chunks is the dealing ``p, p + parts, ...``;
and gemm_walk.cuh's K-order walk (WALK_K) gives each part the same steps in the same order."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tileinfer_backend_cuda.compiler import KERNEL_DIR

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
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler on this machine")
    source = tmp_path / "check.cpp"
    source.write_text(CHECK)
    binary = tmp_path / "check"
    subprocess.run([compiler, "-std=c++17", "-O1", f"-I{KERNEL_DIR}",
                    f"-DBLOCKED_PARTS={blocked}", f"-DPART_CHUNK={chunk}", "-o", str(binary),
                    str(source)], check=True, capture_output=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "0", result.stdout


WALK_CHECK = r"""
#include <algorithm>
#include <cstdio>
#include <vector>
using std::max; using std::min;
#define __device__
#define __forceinline__ inline
#include "gemv_parts.cuh"
constexpr int WT = 1, NTW = 1, PARTS = P, PER_RUN = P / R;
#include "gemm_walk.cuh"
int main() {
    int bad = 0;
    for (int steps = 0; steps <= 200; ++steps) {
        std::vector<int> seen(steps, 0);
        for (int run = 0; run < (SPLIT ? R : 1); ++run) {
            const int part_lo = run * PER_RUN;
            // each part's steps, in its order, as the block's slots meet them
            std::vector<std::vector<int>> met(PART_SUMS);
            for (int i = 0; i < walk_slots(steps); ++i) {
                const int s = walk_step(i, part_lo);
                if (s >= steps) continue;
                ++seen[s];
                met[i % CYCLE / PART_CHUNK].push_back(s);
            }
            for (int q = 0; q < PART_SUMS; ++q) {
                const int p = part_lo + q;
                if ((int)met[q].size() != part_steps(p, steps, PARTS)) { ++bad; continue; }
                for (int j = 0; j < (int)met[q].size(); ++j)
                    bad += met[q][j] != part_step(p, j, steps, PARTS);
            }
        }
        for (int s = 0; s < steps; ++s) bad += seen[s] != 1;
    }
    std::printf("%d\n", bad);
    return bad != 0;
}
"""


@pytest.mark.parametrize("parts,runs,split,chunk", [(8, 1, 0, 1), (8, 4, 0, 1), (8, 4, 1, 1),
                                                    (4, 2, 1, 2), (8, 4, 1, 4), (16, 2, 0, 1)])
def test_walk_k_slots_give_each_part_its_steps_in_order(tmp_path, parts, runs, split, chunk):
    """gemm_walk.cuh's K-order walk (WALK_K): over a block's slots (its run's, when split) every
    step of the block's parts is met once, and each part, by the slot's part index, meets its
    own steps in gemv_parts.cuh's order: the sums gemv.cu adds."""
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler on this machine")
    source = tmp_path / "walk.cpp"
    source.write_text(WALK_CHECK)
    binary = tmp_path / "walk"
    cycle = (parts // runs if split else parts) * chunk
    subprocess.run([compiler, "-std=c++17", "-O1", f"-I{KERNEL_DIR}", "-DWALK_K=1",
                    f"-DP={parts}", f"-DR={runs}", f"-DSPLIT={split}", f"-DPART_CHUNK={chunk}",
                    f"-DSTAGE_STEPS={cycle}", "-o", str(binary), str(source)],
                   check=True, capture_output=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "0", result.stdout
