"""The paths users call, timed as users run them (real SmolLM2-135M-Instruct, greedy).

(a) ``cli`` rows: ``tileinfer run --json -n N PROMPT`` as a new process per run, with the default
options and with ``--speculative ngram``, per backend: wall time of the process, the timings its
``--json`` reports (load, time to the first token, decode tok/s, the start-up's parts) and, once
per backend, the time of ``import torch`` alone in a new process; ``cli_prompt`` rows: per
prompt, the median decode tok/s of each option over ``--cli-repeats`` processes, their ratio and
whether every process gave the same tokens.

(b) ``oneshot`` rows: ``tileinfer.generate`` called several times in one process for each prompt
(plain, and with ``speculative=NgramProposer()``), alternating with ``generate_into`` on a runner
of its own that is kept (unless ``--no-kept``): the wall time of every call, so that the first
call (which may compile and capture) and the later ones show apart, and the n-gram loop's steps
and drafts in its last call.

(c) ``batch`` rows: ``tileinfer.generate_batch`` of B random prompts of 16 tokens, 256 new
tokens each, called twice in one process on random llama3-8b weights; the second call timed
(the first makes the model's runtime: its pool, static steps and graphs).

    python benchmarks/user_paths.py --sections cli,oneshot --backends cuda,triton
    python benchmarks/user_paths.py --sections batch --backends cuda --batches 8,32,64
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from speculative import POLICY, PROMPTS, copy_fraction, policy_settings  # noqa: E402

STORY = "Write a long story about a dragon."


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def emit(row):
    print(json.dumps(row), flush=True)


def cli_run(backend: str, prompt: str, new_tokens: int, extra=()) -> dict:
    cmd = [sys.executable, "-m", "tileinfer_cli", "run", "--json", "--stats", "-b", backend,
           "-n", str(new_tokens), *extra, prompt]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"error": done.stderr[-2000:], "wall": wall}
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["wall"] = round(wall, 4)
    out["stats_line"] = done.stderr.strip().splitlines()[-2:]
    out.pop("text", None)
    out["n_tokens"] = len(out["tokens"])
    return out


def import_torch_seconds() -> float:
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return float(done.stdout.strip())


def section_cli(args):
    prompts = [("dragon", STORY)] + [(name, text) for name, _, text in PROMPTS[: args.cli_prompts]]
    for backend in args.backends:
        seconds = round(import_torch_seconds(), 4)
        emit({"kind": "import_torch", "backend": backend, "seconds": seconds})
        log(f"import torch alone: {seconds} s")
        for name, text in prompts:
            rates, tokens = {}, {}
            for label, extra in (("default", ()), ("ngram", ("--speculative", "ngram"))):
                for repeat in range(args.cli_repeats):
                    row = cli_run(backend, text, args.new_tokens, extra)
                    tokens.setdefault(label, []).append(row.pop("tokens", None))
                    row.update(kind="cli", backend=backend, prompt=name, options=label,
                               repeat=repeat)
                    emit(row)
                    t = row.get("timings", {})
                    if t.get("tokens_per_second"):
                        rates.setdefault(label, []).append(t["tokens_per_second"])
                    log(f"cli {backend} {name} {label}: wall {row['wall']:.2f}s load "
                        f"{t.get('load')} ttft {t.get('time_to_first_token')} start->first "
                        f"{t.get('from_start_to_first_token')} {t.get('tokens_per_second')} tok/s "
                        f"{row.get('n_tokens')} tokens {row.get('error', '')[-300:]}")
                    log(f"    startup {t.get('startup')}")
            if len(rates) == 2:
                medians = {k: statistics.median(v) for k, v in rates.items()}
                reference = tokens["default"][0]
                summary = {"kind": "cli_prompt", "backend": backend, "prompt": name,
                           "runs": args.cli_repeats,
                           "median_tok_s": {k: round(v, 1) for k, v in medians.items()},
                           "ngram_over_default": round(medians["ngram"] / medians["default"], 3),
                           "identical": all(ids == reference for runs in tokens.values()
                                                 for ids in runs)}
                emit(summary)
                log(f"cli_prompt {backend} {name}: medians {summary['median_tok_s']} tok/s, "
                    f"n-gram x{summary['ngram_over_default']}, identical {summary['identical']}")


def section_oneshot(args):
    import torch
    import tileinfer as ti
    from tileinfer.engine.runtime.runtime import runtime_of

    folder = ti.default_model_dir()
    tok = ti.load_tokenizer(folder)
    for backend in args.backends:
        model = ti.load_model(folder, backend=backend, max_len=args.max_len)
        for name, _, text in [("dragon", "open", STORY)] + list(PROMPTS):
            prompt = ti.chat_prompt(folder, [ti.ChatMessage("user", text)])
            ids = tok.encode(prompt, add_special_tokens=False)
            outs = {}
            # A runner of its own kept across calls (what benchmarks used to time), against
            # one-shot generate calls on the model's runtime, with and without n-gram speculation.
            # The three alternate, each call after a garbage collection, so that a drift of the
            # machine or a collection inside a call (milliseconds, on answers of 7-20 ms) weighs on
            # all three alike.
            # --no-kept: the one-shot calls alone, with no kept runner's calls between them
            kept = None if args.no_kept else ti.ModelRunner(
                model, ti.new_cache(model, len(ids) + args.new_tokens + 64))
            labels = ("plain", "ngram") if kept is None else ("kept", "plain", "ngram")
            times = {label: [] for label in labels}
            stats = None  # the last n-gram call's steps and drafts
            each = []  # every n-gram call's (verify steps, plain steps, drafted, accepted)
            for _ in range(args.calls):
                for label in times:
                    spec = None
                    if label == "ngram":
                        spec, stats = ti.NgramProposer(), ti.SpecStats()
                        for setting, value in args.policy.items():
                            setattr(spec, setting, value)
                    gc.collect()
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                    if label == "kept":
                        seq = kept.cache.new_sequence()
                        out = ti.generate_into(kept, seq, ids, args.new_tokens, seed=0)
                        kept.cache.release(seq)
                    else:
                        out = ti.generate(model, ids, args.new_tokens, seed=0, speculative=spec,
                                          spec_stats=stats if spec is not None else None)
                    torch.cuda.synchronize()
                    times[label].append(time.perf_counter() - start)
                    outs[label] = out
                    if label == "ngram":
                        each.append((stats.verify_steps, stats.plain_steps, stats.drafted,
                                     stats.accepted))
            del kept
            later = {k: statistics.median(v[1:]) for k, v in times.items()}
            row = {"kind": "oneshot", "backend": backend, "prompt": name,
                   "tokens": len(outs["plain"]),
                   "identical": all(out == outs["plain"] for out in outs.values()),
                   "copy_fraction": round(copy_fraction(ids, outs["plain"]), 3),
                   "seconds": {k: [round(x, 5) for x in v] for k, v in times.items()},
                   "ngram_steps": dataclasses.asdict(stats),
                   "ngram_steps_each_call": each,
                   # what the loop's policy read after the prompt's calls: ms of an n-row step
                   # (the median of the runtime's latest measurements)
                   "step_ms": {n: round(statistics.median(v) * 1e3, 4) for n, v in
                               sorted(runtime_of(model).step_seconds.items())},
                   "speedup_later": round(later["plain"] / later["ngram"], 3)}
            if "kept" in later:
                row["oneshot_over_kept"] = round(later["plain"] / later["kept"], 3)
            emit(row)
            kept_part = (f"kept {[round(x * 1e3, 1) for x in times['kept']]} ms, "
                         if "kept" in times else "")
            log(f"oneshot {backend} {name}: {row['tokens']} tok, {kept_part}plain "
                f"{[round(x * 1e3, 1) for x in times['plain']]} ms "
                f"(x{row.get('oneshot_over_kept', '-')} of kept), ngram "
                f"{[round(x * 1e3, 1) for x in times['ngram']]} ms, speed-up "
                f"x{row['speedup_later']}, n-gram steps {row['ngram_steps']} (each call's "
                f"verify, plain, drafted, accepted: {each}; step ms {row['step_ms']}), copies "
                f"{row['copy_fraction']}, identical {row['identical']}")
        del model


def section_batch(args):
    import random

    from batch_twice import generate_twice
    from tileinfer.model.random_weights import random_model, shape_config

    for backend in args.backends:
        model = random_model(shape_config("llama3-8b"), backend=backend)
        rng = random.Random(0)
        for batch in args.batches:
            prompts = [[rng.randrange(model.config.vocab_size) for _ in range(16)]
                       for _ in range(batch)]
            tokens, seconds = generate_twice(model, prompts)
            row = {"kind": "batch", "backend": backend, "shape": "llama3-8b", "batch": batch,
                   "tokens": tokens, "seconds": [round(x, 4) for x in seconds],
                   "tok_s_second_call": round(tokens / seconds[1], 1),
                   "tok_s_first_call": round(tokens / seconds[0], 1)}
            emit(row)
            log(f"batch {backend} llama3-8b B={batch}: second call {row['tok_s_second_call']} "
                f"tok/s (first {row['tok_s_first_call']})")
        model.close()
        del model


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sections", default="cli,oneshot")
    p.add_argument("--backends", default="cuda,triton")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--calls", type=int, default=8,
                   help="generate calls per prompt and kind in the oneshot section (the first "
                        "is timed apart; the rest give medians)")
    p.add_argument("--max-len", type=int, default=None,
                   help="the oneshot section's model max_len (default: load_model's)")
    p.add_argument("--no-kept", action="store_true",
                   help="the oneshot section without the kept runner's calls between the "
                        "one-shot ones")
    p.add_argument("--batches", default="8,32,64")
    p.add_argument("--policy", type=policy_settings, default={},
                   help="the oneshot section's n-gram policy instead of NgramProposer's "
                   "defaults, e.g. draft_threshold=0.7 (names: " + ", ".join(POLICY) + ")")
    p.add_argument("--cli-prompts", type=int, default=0,
                   help="also run the first N prompts of benchmarks/speculative.py in the CLI")
    p.add_argument("--cli-repeats", type=int, default=1,
                   help="new processes per prompt and option (the rows give their medians)")
    args = p.parse_args()
    args.backends = args.backends.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    for section in args.sections.split(","):
        {"cli": section_cli, "oneshot": section_oneshot, "batch": section_batch}[section](args)


if __name__ == "__main__":
    main()
