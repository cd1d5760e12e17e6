"""Where the time of one decode step goes: the kernels of a captured 1-token step, profiled.

Builds a random-weight model of a named shape (as `tileinfer bench` does), decodes to a context
of ``--context`` positions, then replays the captured 1-token step (greedy, on-device sampling)
under torch.profiler and prints, per kernel name, the calls per step, the mean kernel duration
and the *attributed* time: from the end of the kernel before it to its own end. Kernels of a
decode step depend on each other, so the attributed times add up to the step's GPU time and
include each kernel's launch latency and its wait for the one before (with programmatic
dependent launch a kernel starts early, so its own duration overstates its share).

    python benchmarks/profile_step.py --shape llama3.2-1b --backend cuda [--int8 | --fp8 \
        | --fp8-weight-only] \
        [--kv-cache int8]

``--rows 1,2,8`` profiles, per count n, a single sequence's captured step of n rows with every
row's logits and greedy token (a speculative verify step: the last token and n - 1 drafts).

``--deterministic`` loads the model batch-invariant (the kernels `--deterministic` runs).

``--batch N`` profiles the batched engine instead (``LLMEngine``, N requests decoding, their
steps replayed from the N-row graph bucket): the kernels of ``--replays`` engine steps, the GPU
span per step and the wall time per step (the difference is the host's share: planning,
metadata, sampling).

One JSON line per kernel name, then a table (stderr). ``--cuda-attention '[{}, {"splits": 1}]'``
profiles the step once per set of the CUDA backend's attention experiments (the "attention" key
of ``TILEINFER_CUDA_EXPERIMENTS``, ops/tuning.py), with a new runner or engine (new graphs)
each time; ``--cuda-gemv '[{}, {"rows": 4, "unroll": 1}]'`` likewise with its GEMV experiments
(the "gemv" key, applied to every GEMV of the step), each with each attention set;
``--cuda-experiments '[{}, {"pdl": false}]'`` likewise with whole sets of the switch's settings.
Each step's line also gives its replays timed without the profiler (``replay_us``: the step's
time as a user's decode sees it; the profiler adds a little to the span).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import defaultdict

import torch

from tileinfer.model.random_weights import random_model, shape_config
from tileinfer.engine.generation.runner import ModelRunner
from tileinfer.backend.sampling import SamplingParams
from tileinfer.engine.kv.cache import new_cache


def short_name(name: str) -> str:
    """A kernel's name without template arguments and parameter lists."""
    name = re.sub(r"\(.*\)$", "", name)
    name = re.sub(r"<.*>", "", name)
    return name.split("::")[-1][:60]


def kernel_events(prof_trace: str) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every GPU kernel in a Chrome trace, in start order."""
    with open(prof_trace) as f:
        events = json.load(f)["traceEvents"]
    kernels = [(short_name(e["name"]), float(e["ts"]), float(e["ts"]) + float(e["dur"]))
               for e in events if e.get("cat") == "kernel"]
    return sorted(kernels, key=lambda k: k[1])


def profile_step(runner, replays: int, graph=None) -> tuple[list, float]:
    """The kernels of `replays` replays of the step's graph under the profiler, and the us a
    replay takes without it."""
    if graph is None:
        graph = runner.captured_graph(1, SamplingParams())  # the greedy 1-token step
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):  # the step's time without the profiler
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    replay_us = start.elapsed_time(end) * 1e3 / replays
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        return kernel_events(path), replay_us


def summarize(kernels, replays: int) -> tuple[list[dict], float]:
    stats = defaultdict(lambda: dict(calls=0, dur=0.0, attributed=0.0))
    prev_end = kernels[0][1]
    for name, start, end in kernels:
        s = stats[name]
        s["calls"] += 1
        s["dur"] += end - start
        s["attributed"] += max(0.0, end - prev_end)
        prev_end = max(prev_end, end)
    span_us = (kernels[-1][2] - kernels[0][1]) / replays
    rows = [dict(kernel=n, calls_per_step=s["calls"] / replays, mean_us=s["dur"] / s["calls"],
                 attributed_us_per_step=s["attributed"] / replays)
            for n, s in stats.items()]
    rows.sort(key=lambda r: -r["attributed_us_per_step"])
    return rows, span_us


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama3.2-1b")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--int8", action="store_true", help="INT8 weights")
    p.add_argument("--fp8", action="store_true", help="FP8 weights and activations")
    p.add_argument("--fp8-weight-only", action="store_true", help="FP8 weights only")
    p.add_argument("--kv-cache", choices=["bf16", "int8"], default="bf16")
    p.add_argument("--context", type=int, default=144, help="cached positions before the step")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--cuda-attention", type=json.loads, default=[None],
                   help="JSON list of attention override dicts for the cuda backend")
    p.add_argument("--cuda-gemv", type=json.loads, default=[None],
                   help="JSON list of GEMV override dicts for the cuda backend")
    p.add_argument("--cuda-experiments", type=json.loads, default=[None],
                   help="JSON list of whole TILEINFER_CUDA_EXPERIMENTS dicts (ops/tuning.py), "
                        "each with each attention and GEMV set")
    p.add_argument("--triton-gemv", type=json.loads, default=[None],
                   help="JSON list of override dicts of the triton backend's row programs, "
                        "e.g. '[{}, {\"rows_per_program\": 4}]'")
    p.add_argument("--rows", default="", help="comma list of row counts: profile verify steps")
    p.add_argument("--batch", default="", help="comma list of batch sizes: profile LLMEngine")
    p.add_argument("--deterministic", action="store_true",
                   help="load the model batch-invariant (the mode's kernels)")
    args = p.parse_args()
    quant = ("int8" if args.int8 else "fp8" if args.fp8
             else "fp8-weight-only" if args.fp8_weight_only else None)

    max_len = args.context + (512 if args.batch else 64)
    model = random_model(shape_config(args.shape), backend=args.backend,
                         quantize=quant, max_len=max_len, batch_invariant=args.deterministic)
    kv = None if args.kv_cache == "bf16" else "int8"
    cache = None if args.batch else new_cache(model, args.context + 64, quantize=kv)
    runs = [(attention, gemv, rows, exp) for attention in args.cuda_attention
            for gemv in args.cuda_gemv for rows in args.triton_gemv
            for exp in args.cuda_experiments]
    for attention, gemv, triton_gemv, exp in runs:
        what = dict(shape=args.shape, backend=args.backend,
                    weights=quant or "bf16", kv_cache=args.kv_cache,
                    context=args.context, deterministic=args.deterministic)
        if triton_gemv is not None:
            from tileinfer_backend_triton.kernels import linear_config

            linear_config.ROW_OVERRIDES.clear()
            linear_config.ROW_OVERRIDES.update(triton_gemv)
            what.update(triton_gemv_overrides=triton_gemv)
        if attention is not None or gemv is not None or exp is not None:
            from tileinfer_backend_cuda.ops import tuning

            settings = dict(exp or {})
            settings.update({k: v for k, v in (("attention", attention), ("gemv", gemv))
                             if v is not None})
            tuning.set_experiments(settings)
            what.update(attention_overrides=attention, gemv_overrides=gemv, experiments=exp)
        if args.batch:
            profile_engine(model, args, what)
        elif args.rows:
            for n in (int(r) for r in args.rows.split(",")):
                rows, span, replay = profile_rows(model, cache, args.context, n, args.replays)
                print_profile(dict(what, rows=n), rows, span, replay)
        else:
            rows, span, replay = profile_context(model, cache, args.context, args.replays)
            print_profile(what, rows, span, replay)


def profile_context(model, cache, context: int, replays: int):
    """Profile of the 1-token step after ``context`` cached positions, on a new runner."""
    runner = ModelRunner(model, cache, graphs=True)
    greedy = SamplingParams()
    seq = cache.new_sequence()
    runner.forward(seq, list(range(1, context + 1)), greedy)
    runner.decode_from_device(seq, greedy)  # captures the 1-token graph
    torch.cuda.synchronize()
    kernels, replay_us = profile_step(runner, replays)
    result = (*summarize(kernels, replays), replay_us)
    cache.release(seq)
    return result


def profile_rows(model, cache, context: int, n: int, replays: int):
    """Profile of a verify step of n rows (every row's logits and greedy token) after
    ``context`` cached positions, on a new runner."""
    runner = ModelRunner(model, cache, graphs=True)
    greedy = SamplingParams()
    seq = cache.new_sequence()
    runner.forward(seq, list(range(1, context + 1)))
    runner.forward(seq, list(range(1, n + 1)), greedy, all_logits=True, sample_rows=True)
    torch.cuda.synchronize()
    graph = runner.static_step(n, all_logits=True).graphs[runner._graph_key(greedy, rows=True)]
    kernels, replay_us = profile_step(runner, replays, graph)
    result = (*summarize(kernels, replays), replay_us)
    cache.release(seq)
    return result


def profile_engine(model, args, what: dict):
    """Kernels, GPU span and wall time of decode steps of the batched engine."""
    import time

    from tileinfer import LLMEngine

    for batch in (int(b) for b in args.batch.split(",")):
        engine = LLMEngine(model, max_running=batch, prefix_caching=False,
                           kv_quantize=None if args.kv_cache == "bf16" else "int8",
                           num_pages=batch * (args.context + 512) // 16 + 64)
        engine.warmup()
        for i in range(batch):
            engine.add_request([(7 * i + j) % 1000 + 1 for j in range(args.context)],
                               max_new_tokens=400, stop_ids=[])
        for _ in range(8):  # prefill, then decode steps from the bucket's graph
            engine.step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.replays):
            engine.step()
        wall_ms = (time.perf_counter() - start) * 1e3 / args.replays
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.replays):
                engine.step()
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            kernels = kernel_events(path)
        rows, span = summarize(kernels, args.replays)
        gpu_busy = sum(r["mean_us"] * r["calls_per_step"] for r in rows)
        row = dict(what, batch=batch, wall_ms_per_step=round(wall_ms, 3),
                   gpu_busy_ms=round(gpu_busy / 1e3, 3), tok_s=round(batch / wall_ms * 1e3, 1))
        print_profile(row, rows[:15], span)
        engine.close()
        del engine
        torch.cuda.empty_cache()


def print_profile(what: dict, rows: list[dict], span: float, replay_us: float | None = None):
    """The kernels' rows and the step's span as JSON lines, then a table; replay_us: the step's
    replays timed without the profiler (single-sequence steps)."""
    for r in rows:
        print(json.dumps(dict(what, **{k: round(v, 3) if isinstance(v, float) else v
                                       for k, v in r.items()})))
    replay = {} if replay_us is None else {"replay_us": round(replay_us, 1)}
    print(json.dumps(dict(what, kernel="step", span_us=round(span, 1), **replay)))
    err = sys.stderr
    unprofiled = "" if replay_us is None else f", replayed unprofiled {replay_us:.1f} us"
    print(f"\n{' '.join(str(v) for v in what.values())}: GPU span {span:.1f} us per step"
          f"{unprofiled}", file=err)
    print(f"{'kernel':<60} {'calls':>6} {'mean us':>8} {'attr us':>8} {'share':>6}", file=err)
    for r in rows:
        print(f"{r['kernel']:<60} {r['calls_per_step']:>6.1f} {r['mean_us']:>8.2f} "
              f"{r['attributed_us_per_step']:>8.1f} {r['attributed_us_per_step'] / span:>6.1%}",
              file=err)


if __name__ == "__main__":
    main()
