"""What an eager prefill costs the host: a random-weight model of a named shape runs a prompt of
``--tokens`` tokens (no CUDA graph: prompts are longer than the captured step sizes) and this
prints the wall time, the time until the host has issued every kernel, and the kernels' own
busy time, medians of 10; then the top of a cProfile of the host side.

When wall ~= host issue and the kernels are busy for much less, the prefill waits on Python,
not on the GPU. ``--static-prefill on`` runs the prompt as ``ModelRunner`` does by default since
b7c1e54 (benchmarks/RESULTS.md, 2026-12-02, "Prefill: the host's time"): padded to its bucket and replayed from a CUDA graph (engine/generation/runner.py
prefill_bucket); ``off`` (the default here) runs it eagerly at its true size.

    python benchmarks/eager_prefill.py --shape llama3-8b --backend cuda --tokens 16
    python benchmarks/eager_prefill.py --shape smollm2-135m --backend triton --tokens 150
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch
from tileinfer.engine.kv.cache import new_cache
from tileinfer.engine.generation.runner import ModelRunner
from tileinfer.model.random_weights import random_model, shape_config


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--tokens", type=int, default=150)
    p.add_argument("--profile-lines", type=int, default=25)
    p.add_argument("--static-prefill", choices=["on", "off"], default="off")
    args = p.parse_args()
    room = 2 * args.tokens + 64  # the padding of a bucket too
    model = random_model(shape_config(args.shape), backend=args.backend, max_len=room)
    cache = new_cache(model, room)
    runner = ModelRunner(model, cache, graphs=True, static_prefill=args.static_prefill == "on")
    ids = [(7 * j) % 1000 + 1 for j in range(args.tokens)]

    def prefill():
        seq = cache.new_sequence()
        runner.forward(seq, ids)
        return seq

    for _ in range(3):
        cache.release(prefill())
    torch.cuda.synchronize()
    walls, issued = [], []
    for _ in range(10):
        start = time.perf_counter()
        seq = prefill()
        issued.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - start) * 1e3)
        cache.release(seq)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        seq = prefill()
        torch.cuda.synchronize()
    cache.release(seq)
    busy = sum(e.device_time_total for e in prof.key_averages()) / 1e3
    print(f"{args.shape} {args.backend} prefill of {args.tokens} (static {args.static_prefill}): "
          f"wall {statistics.median(walls):.2f} ms, host issue {statistics.median(issued):.2f} ms, "
          f"kernels busy {busy:.2f} ms")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(5):
        cache.release(prefill())
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.profile_lines)
    print(text.getvalue())


if __name__ == "__main__":
    main()
