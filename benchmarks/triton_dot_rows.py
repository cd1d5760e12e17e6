"""Triton GEMVs of one SmolLM2-135M step: the row programs (the default for a single sequence's
steps) against tensor-core (dot) tiles, at 1 and at 8 tokens.

A speculative verify step of 8 rows runs every row on the 1-token code (row invariance); the
row programs then cost one program per row, the dot tiles pad the rows to 16 and cost about the
same at 1 and at 8. Each matrix is timed as a step meets it: 30 weight copies (2 for the lm_head)
called back to back in a CUDA graph, the median of 7 replays, microseconds per call. A dot tile
that beats the row programs goes in linear_config.GEMV_TABLE with ``dot=True``.

    python benchmarks/triton_dot_rows.py     # one JSON line per (matrix, config), a summary

``--rows-sweep`` times row-program tiles instead (block_n x block_k x unroll x warps),
for a GEMV_TABLE entry without ``dot``: at K = 576 the default's 1024-wide step is mostly masked,
and a verify step pays the waste once per row. ``--rows-per-program=1,2,4`` sweeps that too (a
1-token step then runs the grouped program with idle slots, which is what it must not lose);
``--matrices=qkv,o`` times only those.
"""

from __future__ import annotations

import itertools
import json
import sys

import torch
from tileinfer_backend_triton.kernels.linear import GemvConfig, launch_linear
from tileinfer_backend_triton.kernels.linear_config import ACT_NONE, ACT_SWIGLU

# name -> (output rows, K, activation): SmolLM2-135M (hidden 576, intermediate 1536, vocab 49152)
SHAPES = {"qkv": (960, 576, ACT_NONE), "o": (576, 576, ACT_NONE),
          "gate_up": (1536, 576, ACT_SWIGLU), "down": (576, 1536, ACT_NONE),
          "lm_head": (49152, 576, ACT_NONE)}
LAYERS = 30


def time_config(weights, xs, outs, act, config, m) -> float:
    """Median us per call of the copies' calls at m rows, replayed from a CUDA graph."""
    def run():
        for w, x, o in zip(weights, xs, outs):
            launch_linear(o[:m], x[:m], w, None, act=act, config=config, invariant=True)

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(7):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e3 / len(weights))
    return sorted(times)[len(times) // 2]


def dot_configs(act) -> list[tuple[str, GemvConfig]]:
    configs = []
    for bn, bk, stages, split in itertools.product((16, 32, 64), (64, 128, 256), (1, 2, 3), (1, 0)):
        if act == ACT_SWIGLU and bn == 64:
            continue  # a gate and an up block: 128 weight rows
        configs.append((f"dot n{bn} k{bk} s{stages} split{split or 'auto'}",
                        GemvConfig(block_n=bn, block_k=bk, num_stages=stages, split_k=split,
                                   dot=True)))
    return configs


def row_configs(act, groups=(1,)) -> list[tuple[str, GemvConfig]]:
    """Row-program tiles; groups: the token rows a program takes (rows_per_program), each
    keeping its own float32 tile of sums."""
    configs = []
    for bn, bk, unroll, warps, group in itertools.product((4, 8, 16), (64, 128, 256), (1, 2),
                                                          (2, 4), groups):
        if bn * bk * unroll * group * (2 if act == ACT_SWIGLU else 1) > 8192 * warps // 4:
            continue  # more float32 sums than the registers of the row programs hold
        configs.append((f"rows n{bn} k{bk} u{unroll} w{warps} r{group}",
                        GemvConfig(block_n=bn, block_k=bk, unroll=unroll, num_warps=warps,
                                   rows_per_program=group)))
    return configs


def main():
    sweep_rows = "--rows-sweep" in sys.argv[1:]
    groups = tuple(int(g) for g in next(
        (a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--rows-per-program=")),
        "1").split(","))
    only = next((a.split("=", 1)[1].split(",") for a in sys.argv[1:]
                 if a.startswith("--matrices=")), list(SHAPES))
    for name, (n_out, k, act) in SHAPES.items():
        if name not in only or (sweep_rows and name == "lm_head"):
            continue  # not asked for, or (the lm_head) on dot tiles already
        copies = 2 if name == "lm_head" else LAYERS
        w_rows = 2 * n_out if act == ACT_SWIGLU else n_out
        weights = [torch.randn(w_rows, k, device="cuda").to(torch.bfloat16) * 0.02
                   for _ in range(copies)]
        xs = [torch.randn(8, k, device="cuda").to(torch.bfloat16) for _ in range(copies)]
        out_dtype = torch.float32 if name == "lm_head" else torch.bfloat16  # the logits
        outs = [torch.empty(8, n_out, device="cuda", dtype=out_dtype) for _ in range(copies)]
        rows = []
        candidates = row_configs(act, groups) if sweep_rows else dot_configs(act)
        for label, config in [("rows (default)", None)] + candidates:
            t1 = time_config(weights, xs, outs, act, config, 1)
            t8 = time_config(weights, xs, outs, act, config, 8)
            rows.append((label, t1, t8))
            print(json.dumps(dict(matrix=name, config=label, us_1_token=round(t1, 2),
                                  us_8_tokens=round(t8, 2))), flush=True)
        base = rows[0]
        best = min(rows[1:], key=lambda r: r[1])
        print(f"{name:8s} rows {base[1]:.2f} / {base[2]:.2f} us at 1 / 8 tokens; fastest at 1 "
              f"token: {best[0]} {best[1]:.2f} / {best[2]:.2f}", file=sys.stderr)
        if sweep_rows:  # no slower at 1 token (2%), fastest at 8
            fair = [r for r in rows[1:] if r[1] <= 1.02 * base[1]] or [best]
            best8 = min(fair, key=lambda r: r[2])
            print(f"{name:8s} fastest at 8 tokens, 1 token within 2%: {best8[0]} "
                  f"{best8[1]:.2f} / {best8[2]:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
