"""The Triton backend's batch-invariant linear (``Invariance.BATCH``) against its default
kernels, per weight of a shape and per row count (kernel time: calls replayed from a CUDA
graph, benchmarks/timing.py), over a grid of tile configurations; each
configuration is also checked for row invariance (rows of 1..128-row steps against the same
rows alone). One JSON object per line (progress on stderr).

    python benchmarks/invariant_linear.py --shape llama3-8b --rows 1,8,64
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch
from tileinfer.backend.hookspecs import Invariance
from tileinfer.model.random_weights import shape_config
from tileinfer_backend_triton.kernels import linear as tl_linear
from tileinfer_backend_triton.kernels.linear_config import InvariantConfig
from timing import time_op


def weights(shape: str):
    """(name, out rows, in, act, out dtype) of each linear of a decode step."""
    c = shape_config(shape)
    return [("qkv", c.qkv_size, c.hidden_size, tl_linear.ACT_NONE, torch.bfloat16),
            ("o", c.hidden_size, c.q_size, tl_linear.ACT_NONE, torch.bfloat16),
            ("gate_up", c.intermediate_size, c.hidden_size, tl_linear.ACT_SWIGLU, torch.bfloat16),
            ("down", c.hidden_size, c.intermediate_size, tl_linear.ACT_NONE, torch.bfloat16),
            ("lm_head", c.vocab_size, c.hidden_size, tl_linear.ACT_NONE, torch.float32)]


def timed(run, m, invariant, config=None) -> float:
    """Microseconds of one m-row call, replayed from a CUDA graph into a kept output."""
    out = run(m, invariant, config)
    return time_op(lambda i: run(m, invariant, config, out)) * 1e6


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--rows", default="1,8,64")
    p.add_argument("--only", help="weights to measure, e.g. qkv,down")
    p.add_argument("--across", action="store_true",
                   help="instead of timing: whether the configurations give the same bits as "
                        "each other (rows of steps of 1, 7, 64 and 128 rows)")
    args = p.parse_args(argv)
    rows = [int(r) for r in args.rows.split(",")]
    dev = torch.device("cuda")
    grid = [InvariantConfig(bm, bn, bk, w, st) for bm, bn, bk, w, st in itertools.product(
        (16, 64), (32, 64), (128, 256), (4,), (3, 4))]
    for name, n_out, k, act, out_dtype in weights(args.shape):
        if args.only and name not in args.only.split(","):
            continue
        w = torch.randn((2 * n_out if act == tl_linear.ACT_SWIGLU else n_out), k, device=dev,
                        dtype=torch.bfloat16) * 0.02
        x = torch.randn(max(rows + [128]), k, device=dev, dtype=torch.bfloat16)
        nbytes = w.numel() * 2

        def run(m, invariant, config=None, out=None):
            if out is None:
                out = torch.empty(m, n_out, device=dev, dtype=out_dtype)
            tl_linear.launch_linear(out, x[:m], w, None, act=act, config=config,
                                    invariant=invariant)
            return out

        if args.across:
            for m in (1, 7, 64, 128):
                outs = {}
                for cfg in grid:
                    if cfg.block_k > k or (act == tl_linear.ACT_SWIGLU and cfg.block_n > 32):
                        continue
                    try:
                        outs[cfg] = run(m, Invariance.BATCH, cfg)
                    except Exception:  # shared memory
                        continue
                first = next(iter(outs.values()))
                differ = [c.__dict__ for c, o in outs.items() if not torch.equal(o, first)]
                print(json.dumps(dict(weight=name, rows=m, configs=len(outs),
                                      differ_from_first=differ)), flush=True)
            continue
        for m in rows:
            for label, inv in (("default", False), ("steps", True)):
                us = timed(run, m, inv)
                print(json.dumps(dict(weight=name, rows=m, kernel=label, us=round(us, 2),
                                      tb_s=round(nbytes / us / 1e6, 3))), flush=True)
        for cfg in grid:
            if cfg.block_k > k or (act == tl_linear.ACT_SWIGLU and cfg.block_n > 32):
                continue
            try:
                alone = run(1, Invariance.BATCH, cfg)
                rows_ok = all(torch.equal(run(m, Invariance.BATCH, cfg)[:1], alone)
                              for m in (7, 64, 128))
                for m in rows:
                    us = timed(run, m, Invariance.BATCH, cfg)
                    print(json.dumps(dict(weight=name, rows=m, kernel="batch", config=cfg.__dict__,
                                          us=round(us, 2), tb_s=round(nbytes / us / 1e6, 3),
                                          invariant=rows_ok)), flush=True)
            except Exception as e:  # a configuration that does not compile (shared memory)
                print(f"{name} {cfg}: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)


if __name__ == "__main__":
    main()
