"""Where a new process's first calls spend their time: the warm-up and the first speculative call.

In a new process (the embedded SmolLM2, greedy, the run's defaults): ``warm_up`` as ``tileinfer
run`` calls it (``--warm-up-ngram``: as with ``--speculative ngram``), then ``generate`` of one
prompt plainly twice, then with ``speculative=NgramProposer()`` three times. Each call's wall
time, the static steps built and the graphs captured in it, and a cProfile of the warm-up and of
the first speculative call go to standard error; JSON rows to standard output. On triton, also
the time of Triton's launcher in the warm-up, and of its on-disk cache lookups and module loads.

``--no-profile`` times the same calls without cProfile (its overhead is large on the launches
of Triton kernels); ``--model`` takes another model folder (e.g. one of
``random_checkpoint.py``'s, the answer then runs to its length).

    python benchmarks/first_calls.py --backend triton --warm-up-ngram [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time

from timing import time_methods


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def profiled(fn, top: int, label: str):
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.enable()
    result = fn()
    prof.disable()
    seconds = time.perf_counter() - start
    text = io.StringIO()
    for order in ("cumulative", "tottime"):
        pstats.Stats(prof, stream=text).sort_stats(order).print_stats(top)
    log(f"--- profile of {label}: {seconds:.3f} s")
    log("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:20000])
    return result, seconds


def time_triton_phases() -> dict:
    """Wrap the parts of a Triton kernel's first launch in a process with timers: every
    launch's whole time in Triton's launcher (its first one makes the argument binder too),
    finding the kernel in the on-disk cache (``_do_compile``: the cache key, the
    metadata and binary files), loading it (``_init_handles``: the module and the launcher's
    shared library). Returns the totals (seconds, calls), filled as kernels launch."""
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.jit import JITFunction

    totals: dict = {}
    # every_launch: all of it (binder, cache, load, launch)
    time_methods(JITFunction, ["run", "_do_compile"], totals, ["every_launch", "disk_cache"])
    time_methods(CompiledKernel, ["_init_handles"], totals, ["load"])
    return totals


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backend", default="cuda")
    p.add_argument("--prompt", default="Repeat the following paragraph exactly, word for word:"
                   "\n\nThe old lighthouse stood at the edge of the cliff for two hundred years. "
                   "Its keeper, a quiet man named Elias, climbed the spiral stairs every evening "
                   "to light the lamp.")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--top", type=int, default=35)
    p.add_argument("--model", default=None, help="a model folder (default: the embedded one)")
    p.add_argument("--no-profile", action="store_true", help="no cProfile of any call")
    p.add_argument("--warm-up-ngram", action="store_true",
                   help="warm up for n-gram speculation (as tileinfer run --speculative ngram)")
    args = p.parse_args()

    import torch
    import tileinfer as ti
    from tileinfer.engine.runtime.runtime import runtime_of

    folder = ti.resolve_model_dir(args.model)
    model = ti.load_model(folder, backend=args.backend)
    tok = ti.load_tokenizer(folder)
    ids = tok.encode(ti.chat_prompt(folder, [ti.ChatMessage("user", args.prompt)]),
                     add_special_tokens=False)

    def sync():
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def counts():
        steps = runtime_of(model).steps
        return {"builds": len(steps.steps()), "captures": steps.captures,
                "eager_runs": steps.eager_runs}

    def timed(label, fn, profile=False):
        before = counts()
        sync()
        if profile and not args.no_profile:
            out, seconds = profiled(fn, args.top, label)
        else:
            start = time.perf_counter()
            out = fn()
            sync()
            seconds = time.perf_counter() - start
        after = counts()
        row = {"backend": args.backend, "call": label, "seconds": round(seconds, 4),
               "tokens": len(out) if out is not None else 0,
               "new_steps": after["builds"] - before["builds"],
               "captures": after["captures"] - before["captures"],
               "eager_runs": after["eager_runs"] - before["eager_runs"]}
        print(json.dumps(row), flush=True)
        log(f"first_calls {args.backend} {label}: {row['seconds'] * 1e3:.1f} ms, "
            f"{row['tokens']} tokens, {row['new_steps']} steps built, {row['captures']} "
            f"captures, {row['eager_runs']} eager runs")
        return out

    phases = time_triton_phases() if args.backend == "triton" else None
    proposer = ti.NgramProposer() if args.warm_up_ngram else None
    timed("warm_up", lambda: ti.warm_up(model, speculative=proposer), profile=True)
    if phases is not None:
        log("triton first launches in the warm-up: " + ", ".join(
            f"{k} {v[0] * 1e3:.1f} ms / {v[1]} calls" for k, v in phases.items()))
        phases.clear()
    plain = None
    for i in range(2):
        plain = timed(f"plain {i + 1}",
                      lambda: ti.generate(model, ids, args.new_tokens, seed=0))
    for i in range(3):
        spec = ti.SpecStats()
        out = timed(f"ngram {i + 1}",
                    lambda: ti.generate(model, ids, args.new_tokens, seed=0,
                                        speculative=ti.NgramProposer(), spec_stats=spec),
                    profile=(i == 0))
        log(f"    {spec.summary()}; identical to plain: {out == plain}")
    steps = runtime_of(model).step_seconds
    log("step seconds by rows: " + ", ".join(
        f"{n}: {[round(s * 1e3, 3) for s in v]}" for n, v in sorted(steps.items())))


if __name__ == "__main__":
    main()
