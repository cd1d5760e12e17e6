"""Decode attention of a batched step: B sequences of one query token each at context C, the
llama3-8b attention shape (32 heads, 8 kv heads, head_dim 128, bf16 pages of 16), through each
backend's attention op with the workspace the engine gives a step of B rows. Reports the time per
call and the K/V bytes read per second; ``--cuda-attention`` repeats the cuda backend's runs per
set of its attention experiments (ops/tuning.py's "attention" key; "split_max_tokens" gives
steps of more rows than the shipped SPLIT_MAX_TOKENS a split workspace).

The engine's batch-64 step at short context spends much of its time here (benchmarks/RESULTS.md,
the FP8 profiles), and served requests run at the longer contexts of their prompts: this is the
op on its own, at the batch sizes and contexts of both.

    python3 benchmarks/batch_attention.py --batches 1,8,64 --contexts 144,512,1024,2048
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

import ops
from tileinfer.backend import get_backend
from tileinfer.backend.types import AttentionStep, LayerKV

SHAPE = ops.MODELS["llama3-8b"]
PAGE = 16


def make_calls(table, batch: int, ctx: int):
    """Zero-argument attention calls of one batched decode step, each on its own copy of the
    cache (enough copies that the K/V bytes do not stay in L2), and the bytes one call reads."""
    heads, kv_heads, hd = SHAPE["heads"], SHAPE["kv_heads"], SHAPE["head_dim"]
    pages = math.ceil(ctx / PAGE)
    nbytes = 2 * batch * ctx * kv_heads * hd * 2
    q = torch.randn(batch, heads, hd, device=ops.DEV).to(torch.bfloat16)
    out = torch.empty_like(q)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=ops.DEV)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=ops.DEV)
    empty_pos = torch.empty(0, dtype=torch.int32, device=ops.DEV)
    empty_slots = torch.empty(0, dtype=torch.int64, device=ops.DEV)
    ws = table.attention_workspace(batch, heads, hd, pages * PAGE, q.device)
    calls = []
    for _ in range(ops.copies_for(nbytes)):
        shape = (batch * pages, PAGE, kv_heads, hd)
        kv = LayerKV(torch.randn(shape, device=ops.DEV).to(torch.bfloat16),
                     torch.randn(shape, device=ops.DEV).to(torch.bfloat16), None, None, None)
        # each sequence's pages in random order over the whole pool
        block_table = torch.randperm(batch * pages, device=ops.DEV).to(torch.int32)
        step = AttentionStep(empty_pos, empty_slots, cu, lens, block_table.view(batch, pages),
                             1, pages * PAGE)
        calls.append(lambda kv=kv, step=step: table.attention(out, q, kv, step, hd ** -0.5, True,
                                                              ws))
    return calls, nbytes


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--contexts", default="144,512,1024,2048")
    p.add_argument("--backends", default="cuda,triton")
    p.add_argument("--cuda-attention", type=json.loads, default=[{}],
                   help='a JSON list of attention experiment sets, e.g. \'[{}, {"splits": 2}]\'')
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes on the CPU (the ref backend) to check the script")
    args = p.parse_args()
    if args.dry_run:
        ops._dry_run_setup()

    for name in args.backends.split(","):
        table = get_backend(name)
        for settings in args.cuda_attention if name == "cuda" else [{}]:
            if name == "cuda":
                from tileinfer_backend_cuda.ops import tuning

                tuning.set_experiments({"attention": settings})
            for batch in (int(b) for b in args.batches.split(",")):
                for ctx in (int(c) for c in args.contexts.split(",")):
                    calls, nbytes = make_calls(table, batch, ctx)
                    timed = ops.try_time(calls, backend=name, batch=batch, ctx=ctx)
                    del calls
                    if timed is None:
                        continue
                    us = timed[0]
                    row = {"backend": name, "settings": settings, "batch": batch, "ctx": ctx,
                           "us": round(us, 2), "TBps": round(nbytes / us / 1e6, 3)}
                    print(json.dumps(row), flush=True)
                    print(f"{name} {json.dumps(settings)} batch {batch} ctx {ctx}: {us:.2f} us, "
                          f"{nbytes / us / 1e6:.3f} TB/s", file=sys.stderr)
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
