"""Speculative decoding on the GPU: n-gram speculation against plain decoding, per prompt and
backend. Prints one JSON object per line on stdout and a short table on stderr.

(a) ``prompt`` rows: the real SmolLM2-135M-Instruct (the embedded default model, or ``--model``),
greedy, CUDA graphs on, over PROMPTS: copy-heavy ones (repeat, rewrite with changed names, code
edit, quote and answer, spelling fixes), whose answers mostly copy the prompt, and open ones
(story, explanation, short answers), whose answers do not. For each prompt and backend: plain
decoding (pipelined) and ``generate(..., speculative=NgramProposer(k))`` on the model
runtime's runner (the one ``generate`` and the CLI use; ``--own-runner``: a runner and cache of
the benchmark's own) with the same
max_new_tokens and stop tokens; wall time of the whole generation (prefill included; the median
of at least ``--repeats`` runs each, more for short answers until each kind has run for
``--min-seconds``, the two kinds of run alternating, each after a garbage collection, after a
warm-up run of each that captures the graphs), the speed-up (plain seconds /
speculative seconds), the acceptance and steps (``SpecStats``), and whether the output equals
plain greedy token for token, and ``copy_fraction``: the share of the plain answer's tokens that
prompt lookup predicts from the tokens before each (how much the answer really copies: a small
model asked to rewrite may write something else). Where the output differs:
``first_divergence`` (the index of the first different token) and ``top2_gap``, how far apart
plain decoding's two best logits were there (float32 logits; also in bf16 ulps of the larger
one).

(b) ``step_cost`` rows per backend: what a step of 1..k + 1 rows costs on this model, as a graph
replay and as the speculative loop measured it in the runs (its cost model: it drafts only where
the extra rows pay), and a ``summary`` row: the geometric mean of the speed-ups over all
prompts, over the copy-heavy and over the open ones, the smallest speed-up, the prompts whose
answers copy at least ``COPYING`` of their tokens and their smallest speed-up, and whether every
output was identical.

(c) With ``--verify-cost``: ``verify_cost`` rows: a random-weight llama3-8b-shaped model, a
sequence of ``--context`` cached tokens, and the captured step of n = k + 1 tokens with all
logits, k = 0..8: GPU time per replay (CUDA events, median of 5 rounds of 20 replays) and its
ratio to the 1-token step.

    python benchmarks/speculative.py                                # cuda and triton, ~2-4 min
    python benchmarks/speculative.py --backends ref --repeats 1     # ref's identity (slow)
    python benchmarks/speculative.py --device cpu --backends ref --new-tokens 16 --repeats 1
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time

import torch
from tileinfer.engine.kv.cache import new_cache

CODE = '''def summarize(values):
    total = 0
    count = 0
    for value in values:
        if value is None:
            continue
        total += value
        count += 1
    if count == 0:
        return None
    mean = total / count
    spread = max(values) - min(values)
    return {"total": total, "mean": mean, "spread": spread}
'''

PARAGRAPH = (
    "Alice met Bob at the train station on a cold Monday morning. Bob had brought two cups of "
    "coffee, one for himself and one for Alice, and together they waited for Carol, who was "
    "late as usual. When Carol finally arrived, she apologized and explained that her cat had "
    "hidden her keys under the sofa. Alice laughed and said that Carol's cat was the cleverest "
    "animal in the city."
)

PASSAGE = (
    "The Riverside Library opened in 1894 with two hundred books donated by the mill owner "
    "Thomas Hale. In 1921 a fire destroyed the east wing, and the town rebuilt it in brick the "
    "following year. Today the library lends more than forty thousand books a year and hosts a "
    "chess club every Thursday evening."
)

# (name, kind, user message): kind "copy" for answers that mostly copy the prompt.
PROMPTS = [
    ("repeat", "copy", "Repeat the following paragraph exactly, word for word:\n\n" + PARAGRAPH),
    ("rewrite", "copy", "Rewrite this paragraph with the names Alice, Bob and Carol changed to "
                        "Maria, Tom and Lena, keeping everything else the same:\n\n" + PARAGRAPH),
    ("code_edit", "copy", "Rename the variable `total` to `running_sum` in this Python function "
                          "and show the whole function:\n\n```python\n" + CODE + "```"),
    ("quote_answer", "copy", PASSAGE + "\n\nQuote the sentence of this text that mentions the "
                             "fire, then say in which year the library opened."),
    ("fix_typos", "copy", "Correct the spelling mistakes in this text and write it out in full: "
                          "The comittee will meet on Tusday to discus the new budjet. Every "
                          "member should bring there notes and a copy of last years report, "
                          "wich was sent by email."),
    ("story", "open", "Write a short story about a lighthouse keeper who finds a message in a "
                      "bottle."),
    ("explanation", "open", "Explain how a refrigerator keeps food cold."),
    ("short_qa", "open", "What is the capital of France?"),
    ("advice", "open", "Give me three tips for sleeping better."),
]


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def emit(row):
    print(json.dumps(row), flush=True)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def geomean(values) -> float | None:
    values = [v for v in values if v and v > 0]
    return round(math.exp(sum(math.log(v) for v in values) / len(values)), 4) if values else None


def top2_gap(model, prompt, tokens, index) -> tuple[float, float]:
    """Plain decoding's two best logits before tokens[index]: their gap, and the gap in bf16
    ulps of the larger one (bf16 keeps 8 significant bits)."""
    from tileinfer import forward

    cache = new_cache(model, len(prompt) + index + 1)
    logits = forward(model, cache, cache.new_sequence(), prompt + tokens[:index])[0]
    top = torch.topk(logits.float(), 2).values
    ulp = 2.0 ** (torch.floor(torch.log2(top[0].abs())) - 7)
    return float(top[0] - top[1]), float((top[0] - top[1]) / ulp)


# Answers that copy at least this share of their tokens from their context (``copy_fraction``):
# where a 2x speed-up is within reach. With every lookup right, a verify step of 8 rows giving 8
# tokens for about 1.3 steps' time, the speed-up on a share f of copied tokens is about
# 1 / ((1 - f) + f * 1.3 / 8), 2x at f = 0.6.
COPYING = 0.6


def copy_fraction(prompt, answer) -> float:
    """The share of the answer's tokens that prompt lookup predicts from every token before it
    (``NgramProposer.prediction``): how much of the answer copies its context, whatever the
    prompt asked for."""
    from tileinfer import NgramProposer

    lookup, known, hits = NgramProposer(), list(prompt), 0
    for token in answer:
        hits += lookup.prediction(known) == token
        known.append(token)
    return hits / len(answer) if answer else 0.0


def bench_prompt(model, runner, name, kind, prompt, stop_ids, args):
    from tileinfer import NgramProposer, SamplingParams, SpecStats, generate_into

    greedy = SamplingParams()

    def run(proposer):
        seq = runner.cache.new_sequence()
        stats = SpecStats()
        sync()
        start = time.perf_counter()
        out = generate_into(runner, seq, prompt, args.new_tokens, greedy, stop_ids=stop_ids,
                            seed=0, speculative=proposer, spec_stats=stats)
        sync()
        seconds = time.perf_counter() - start
        runner.cache.release(seq)
        return out, seconds, stats

    # Warm-up runs (kernels compile, graphs are captured), then plain and speculative runs
    # alternately, each after a garbage collection: a drift of the machine, or a collection in
    # the middle of a run (milliseconds, on answers that take 10-20 ms), weighs on both alike.
    run(None)
    run(ngram_proposer(args))
    plain_runs, spec_runs = [], []
    # A 15-token answer takes ~15 ms, mostly its prefill, and moves by +-10% between runs: short
    # answers get more runs, until each kind has run for min_seconds (at most 20 times repeats).
    while len(plain_runs) < max(1, args.repeats) or (
            sum(r[1] for r in plain_runs) < args.min_seconds
            and len(plain_runs) < 20 * max(1, args.repeats)):
        gc.collect()
        plain_runs.append(run(None))
        gc.collect()
        spec_runs.append(run(ngram_proposer(args)))
    plain, plain_s = plain_runs[0][0], statistics.median(r[1] for r in plain_runs)
    out, spec_s, stats = spec_runs[0][0], statistics.median(r[1] for r in spec_runs), spec_runs[0][2]
    row = dict(kind="prompt", backend=model.ops.name, prompt=name, prompt_kind=kind,
               prompt_tokens=len(prompt), k=args.k, generated=len(out),
               plain_generated=len(plain), plain_s=round(plain_s, 5), spec_s=round(spec_s, 5),
               plain_tok_s=round(len(plain) / plain_s, 1), spec_tok_s=round(len(out) / spec_s, 1),
               speedup=round(plain_s / spec_s, 4), acceptance=stats.acceptance_rate,
               drafted=stats.drafted, accepted=stats.accepted, verify_steps=stats.verify_steps,
               plain_steps=stats.plain_steps, wasted_steps=stats.wasted_steps,
               runs=len(plain_runs), copy_fraction=round(copy_fraction(prompt, plain), 3),
               identical=out == plain)
    if out != plain:
        i = next((i for i, (a, b) in enumerate(zip(out, plain)) if a != b),
                 min(len(out), len(plain)))
        row.update(first_divergence=i)
        if i < len(plain):
            gap, ulps = top2_gap(model, prompt, plain, i)
            row.update(top2_gap=gap, top2_gap_bf16_ulps=ulps)
    if math.isnan(row["acceptance"]):
        row["acceptance"] = None
    emit(row)
    return row


def step_costs(model, runner, backend, prompt, args):
    """``step_cost`` rows: for n = 1..k + 1 rows, the GPU time of a replay of the captured step
    (all logits; median of 5 rounds of 20 replays, after a prompt) and what the speculative
    loop measured for steps of n rows in the runs above (``ModelRunner.step_seconds``: device
    time from the previous step's end to this step's end, host delays included), each also
    relative to the 1-row step."""
    seq = runner.cache.new_sequence()
    runner.forward(seq, prompt)
    start = len(seq)
    gpu = {}
    for n in range(1, args.k + 2):
        runner.forward(seq, list(range(1, n + 1)), all_logits=True)  # captures its graph
        sync()
        rounds = []
        graph = runner.static_step(n, all_logits=True).graphs.get(None) if runner.graphs else None
        for _ in range(5):
            if graph is not None:
                begin = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(20):
                    graph.replay()
                end.record()
                end.synchronize()
                rounds.append(begin.elapsed_time(end) / 20)
            else:
                runner.cache.truncate(seq, start)
                t = time.perf_counter()
                runner.forward(seq, list(range(1, n + 1)), all_logits=True)
                sync()
                rounds.append((time.perf_counter() - t) * 1e3)
        runner.cache.truncate(seq, start)
        gpu[n] = statistics.median(rounds)
    runner.cache.release(seq)
    loop = {n: statistics.median(v) * 1e3 for n, v in runner.step_seconds.items() if v}
    for n in range(1, args.k + 2):
        row = dict(kind="step_cost", backend=backend, rows=n, replay_ms=round(gpu[n], 4),
                   replay_vs_1_row=round(gpu[n] / gpu[1], 3))
        if n in loop:
            row.update(loop_ms=round(loop[n], 4))
            if 1 in loop:
                row.update(loop_vs_1_row=round(loop[n] / loop[1], 3))
        emit(row)
    log(f"{backend:7s} step ms by rows (graph replay / as the loop measured): " + ", ".join(
        f"{n}: {gpu[n]:.3f}" + (f"/{loop[n]:.3f}" if n in loop else "") for n in gpu))


def bench_backend(backend, args):
    from tileinfer import (ChatMessage, ModelRunner, chat_prompt, load_model, load_tokenizer,
                           runner_for)
    from tileinfer.io.default_model import default_model_dir
    from tileinfer.io.generation_config import generation_defaults

    folder = args.model or default_model_dir()
    if str(folder).endswith(".gguf"):  # e.g. the SmolLM2 GGUF carried to the GPU machine
        from tileinfer import import_gguf

        folder = import_gguf(folder)
    t0 = time.perf_counter()
    model = load_model(folder, dtype=args.dtype, backend=backend, device=args.device,
                       max_len=args.max_len)
    tokenizer = load_tokenizer(folder)
    _, eos = generation_defaults(folder, model.config)
    stop_ids = [] if args.no_stop else eos
    prompts = [p for p in PROMPTS if not args.prompts or p[0] in args.prompts]
    encoded = [(name, kind, tokenizer.encode(chat_prompt(folder, [ChatMessage("user", text)]),
                                             add_special_tokens=False))
               for name, kind, text in prompts]
    longest = max(len(ids) for _, _, ids in encoded)
    if args.own_runner:
        runner = ModelRunner(model, new_cache(model, longest + args.new_tokens + 64))
    else:  # the model runtime's runner, which generate, ChatSession and the CLI run on
        runner = runner_for(model)
    rows = []
    for name, kind, ids in encoded:
        rows.append(bench_prompt(model, runner, name, kind, ids, stop_ids, args))
        r = rows[-1]
        log(f"{backend:7s} {name:13s} {kind:5s} {r['generated']:4d} tok  plain "
            f"{r['plain_tok_s']:7.1f} tok/s  spec {r['spec_tok_s']:7.1f} tok/s  "
            f"{r['speedup']:5.2f}x  acc "
            f"{'  -' if r['acceptance'] is None else format(100 * r['acceptance'], '3.0f')}%  "
            f"copies {r['copy_fraction']:.2f}  "
            f"steps {r['verify_steps']}v+{r['plain_steps']}p+{r['wasted_steps']}w  "
            f"{'identical' if r['identical'] else 'DIFFERS at ' + str(r['first_divergence'])}")
    step_costs(model, runner, backend, encoded[0][2], args)
    speedups = [r["speedup"] for r in rows]
    summary = dict(kind="summary", backend=backend, prompts=len(rows), k=args.k,
                   new_tokens=args.new_tokens,
                   geomean_speedup=geomean(speedups),
                   geomean_copy=geomean([r["speedup"] for r in rows if r["prompt_kind"] == "copy"]),
                   geomean_open=geomean([r["speedup"] for r in rows if r["prompt_kind"] == "open"]),
                   copying=[r["prompt"] for r in rows if r["copy_fraction"] >= COPYING],
                   min_copying=min([r["speedup"] for r in rows if r["copy_fraction"] >= COPYING],
                                   default=None),
                   min_speedup=min(speedups), all_identical=all(r["identical"] for r in rows),
                   seconds=round(time.perf_counter() - t0, 1))
    emit(summary)
    fmt = lambda v: "-" if v is None else f"{v:.3f}x"  # noqa: E731
    log(f"{backend:7s} geomean {fmt(summary['geomean_speedup'])} (copy "
        f"{fmt(summary['geomean_copy'])}, open {fmt(summary['geomean_open'])}), min "
        f"{summary['min_speedup']:.3f}x, all identical: {summary['all_identical']}, "
        f"{summary['seconds']:.0f} s")
    del runner
    model.close()  # the runtime's pool, steps and graphs
    return summary


def bench_verify_cost(backend, args):
    from tileinfer import ModelRunner
    from tileinfer.model.random_weights import random_model, shape_config

    model = random_model(shape_config(args.shape), dtype=args.dtype, backend=backend,
                         device=args.device, max_len=args.context + 64)
    cache = new_cache(model, args.context + 64)
    runner = ModelRunner(model, cache)
    runner.add_sizes(range(1, 10))
    seq = cache.new_sequence()
    gen = torch.Generator().manual_seed(0)
    runner.forward(seq, torch.randint(0, model.config.vocab_size, (args.context,),
                                      generator=gen).tolist())
    times = {}
    for n in range(1, 10):
        start = len(seq)
        ids = list(range(1, n + 1))
        runner.forward(seq, ids, all_logits=True)  # captures the graph
        sync()
        rounds = []
        for _ in range(5):
            if runner.graphs:
                graph = runner.static_step(n, all_logits=True).graphs[None]
                begin = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(20):
                    graph.replay()  # the same positions each time: only the time matters
                end.record()
                end.synchronize()
                rounds.append(begin.elapsed_time(end) / 20)
            else:  # no graphs (a CPU smoke run): whole eager steps
                cache.truncate(seq, start)
                t = time.perf_counter()
                runner.forward(seq, ids, all_logits=True)
                rounds.append((time.perf_counter() - t) * 1e3)
        cache.truncate(seq, start)
        times[n] = statistics.median(rounds)
        emit(dict(kind="verify_cost", shape=args.shape, backend=model.ops.name,
                  context=args.context, k=n - 1, tokens=n, step_ms=times[n],
                  relative_to_1_token=times[n] / times[1]))
    cache.release(seq)


def ngram_proposer(args):
    from tileinfer import NgramProposer

    lookup = NgramProposer(k=args.k)
    for name, value in args.policy.items():
        setattr(lookup, name, value)
    return lookup


POLICY = ("smoothing", "draft_threshold", "trust_threshold", "min_gain", "prior_misses",
          "row_cost")  # NgramProposer's attributes that the loop's DraftPolicy reads


def policy_settings(text: str) -> dict:
    """``--policy``'s "name=value,..." as {name: float}, names among POLICY."""
    settings = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in POLICY:
            raise argparse.ArgumentTypeError(f"--policy: {name!r} is not one of {POLICY}")
        settings[name] = float(value)
    return settings


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="cuda,triton",
                   help="comma-separated (default cuda,triton; ref checks identity, slowly)")
    p.add_argument("--model", help="model folder or .gguf file (default: the embedded "
                   "SmolLM2-135M-Instruct)")
    # k + 1 <= 8: verify steps then run in the captured decode kernels, which compute each row
    # exactly as a 1-token step does.
    p.add_argument("--k", type=int, default=7, help="n-gram drafts per step at most (default 7)")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--max-len", type=int, default=None,
                   help="the model's max_len (default: load_model's, as `tileinfer run` and "
                        "`generate` users get it; a static step's attention grid follows it)")
    p.add_argument("--repeats", type=int, default=5, help="runs of each kind at least")
    p.add_argument("--min-seconds", type=float, default=0.5,
                   help="runs of each kind until their time adds up to this (short answers)")
    p.add_argument("--own-runner", action="store_true",
                   help="run on a ModelRunner and cache of the benchmark's own instead of the "
                   "model runtime's runner (the one generate and the CLI use)")
    p.add_argument("--policy", type=policy_settings, default={},
                   help="the n-gram loop's policy instead of NgramProposer's defaults, e.g. "
                   "draft_threshold=0.7,trust_threshold=0.8 (names: " + ", ".join(POLICY) + ")")
    p.add_argument("--prompts", help="comma-separated prompt names (default: all)")
    p.add_argument("--no-stop", action="store_true",
                   help="generate new-tokens tokens, past the end-of-answer token")
    p.add_argument("--device", default="cuda", help="cuda (default); cpu for a smoke run")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--verify-cost", action="store_true", help="also time verify steps on a "
                   "random llama3-8b-shaped model")
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--context", type=int, default=512, help="cached tokens for verify_cost")
    args = p.parse_args()
    args.dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    args.prompts = args.prompts.split(",") if args.prompts else None
    backends = args.backends.split(",")
    t0 = time.perf_counter()
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    emit(dict(kind="setup", device=args.device, gpu=gpu, backends=backends, k=args.k,
              new_tokens=args.new_tokens, repeats=args.repeats, torch=torch.__version__))
    summaries = [bench_backend(backend, args) for backend in backends]
    if args.verify_cost:
        for backend in backends:
            bench_verify_cost(backend, args)
    for s in summaries:
        log(f"summary {s['backend']}: geomean {s['geomean_speedup']}x, min "
            f"{s['min_speedup']:.3f}x, identical {s['all_identical']}")
    log(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
