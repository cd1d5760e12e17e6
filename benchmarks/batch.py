"""Many requests at once on the GPU: the serving engine (``tileinfer.LLMEngine``) on random
weights of a named shape. Prints one JSON object per line (progress on stderr).

(a) ``static`` rows: N requests of a 16-token prompt and 256 new tokens (greedy, no stop ids),
all added at once, as gpt-fast measures a static batch: tokens per second over the whole run
(``tok_s``: N * 256 / wall time, prefill included) and over the decode steps only
(``decode_tok_s``, from the step that gave every request its first token to the end); each
batch size after two warm-up runs of its own (its prefill step's shape meets its kernels there,
and with static mixed steps runs eagerly, then is captured), the median of up to 3 runs
(``--repeats``).

(b) ``continuous`` row: ``--requests`` (256) requests with prompt lengths drawn uniformly from
64-2,048 and output lengths from 64-512 (seeded), all arriving at once; total generated tokens
per second, with the engine's counters (steps, preemptions, prefill tokens). ``one_by_one`` row:
the first ``--one-by-one`` of the same requests run one after another with
``tileinfer.generate`` (CUDA graphs, pipelined: the fastest single-sequence path); its tok/s is
measured on that subset (``measured_requests``) and ``extrapolated_s`` scales its time to all
requests by their token counts (an extrapolation, not a measurement). ``speedup`` compares the
two throughputs.

(c) ``prefix_ttft`` rows: time to first token of a request whose prompt is a 2,000-token prefix
already in the prefix cache plus a 16-token suffix, against one of the same length that shares
nothing (median of ``--repeats``; the engine otherwise idle).

(d) ``agreement`` row: in bf16 a batched step sums the matrix products in another order than a
single-sequence step, so greedy tokens may part. For the first ``--agree`` requests of (b), run
together, against each alone: the share of requests whose tokens are identical, and for the
others the first divergence and the gap between the two best logits of the single-sequence run
there (random weights have many near ties, so expect early divergence there; real weights
diverge much less).

Timing: wall clock around ``step()`` calls (the engine waits for each step's sampled tokens), with
``torch.cuda.synchronize`` at the edges; graphs are captured and kernels compiled in a warm-up
before anything is timed.

    python benchmarks/batch.py                                  # llama3-8b, every section
    python benchmarks/batch.py --shape llama3.2-1b --batches 1,8,32,64 --sections static
    python benchmarks/batch.py --backend triton --int8 --sections static --batches 64
    python benchmarks/batch.py --sections static,prefix --no-static-mixed   # prefill steps eager
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time

import torch

from tileinfer import LLMEngine, SamplingParams, forward, generate, new_cache
from tileinfer.model.random_weights import random_model, shape_config

GREEDY = SamplingParams()


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def emit(row):
    print(json.dumps(row), flush=True)


def now() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def release_memory():
    """Give the memory of dropped engines back to the device, so the next pool can take it."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def random_ids(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def run_all(engine, requests):
    """Add every (prompt, max_new) at once and step to the end. Returns the tokens per request,
    the wall time, and the time at which every request had its first token."""
    start = now()
    ids = [engine.add_request(p, GREEDY, max_new_tokens=m, stop_ids=[]) for p, m in requests]
    tokens = {rid: [] for rid in ids}
    waiting_first, all_first = set(ids), None
    while engine.has_unfinished():
        for out in engine.step():
            if out.finish_reason == "error":
                raise RuntimeError(out.error)
            tokens[out.request_id] += out.new_tokens
            waiting_first.discard(out.request_id)
        if all_first is None and not waiting_first:
            all_first = time.perf_counter()
    end = now()
    return [tokens[rid] for rid in ids], end - start, all_first - start


def make_engine(model, args, max_running, prefix_caching=True):
    engine = LLMEngine(model, max_running=max_running, max_step_tokens=args.max_step_tokens,
                       prefix_caching=prefix_caching, kv_quantize=args.kv_cache,
                       memory_fraction=args.memory_fraction, static_mixed=args.static_mixed)
    t = now()
    engine.warmup()
    log(f"engine: {engine.stats()['pages_total']} pages of {engine.cache.page_size} "
        f"({engine.cache.nbytes / 2**30:.1f} GiB), graphs captured in {now() - t:.1f} s")
    return engine


def static_section(model, args, base):
    batches = [int(b) for b in args.batches.split(",")]
    engine = make_engine(model, args, max(batches), prefix_caching=False)
    rng = random.Random(args.seed)
    vocab = model.config.vocab_size
    for n in batches:
        # Two warm-up runs of the same batch (its prefill step's shape meets its kernels and,
        # with static mixed steps, runs eagerly, then is captured), then the median of the
        # repeats, as `tileinfer bench --batch` measures.
        for _ in range(2):
            run_all(engine, [(random_ids(rng, vocab, 16), 4) for _ in range(n)])
        runs = []
        for _ in range(max(1, min(args.repeats, 3))):
            requests = [(random_ids(rng, vocab, 16), args.new_tokens) for _ in range(n)]
            _, wall, first = run_all(engine, requests)
            runs.append((wall, first))
        wall, first = sorted(runs)[len(runs) // 2]
        generated = n * args.new_tokens
        row = dict(base, bench="static", batch=n, prompt=16, new_tokens=args.new_tokens,
                   wall_s=round(wall, 3), tok_s=round(generated / wall, 1),
                   decode_tok_s=round(n * (args.new_tokens - 1) / (wall - first), 1),
                   runs=len(runs))
        emit(row)
        log(f"static batch {n}: {row['tok_s']} tok/s ({row['decode_tok_s']} decoding)")
    engine.close()


def mixed_requests(args, vocab):
    rng = random.Random(args.seed + 1)
    return [(random_ids(rng, vocab, rng.randint(64, 2048)), rng.randint(64, 512))
            for _ in range(args.requests)]


def continuous_section(model, args, base):
    requests = mixed_requests(args, model.config.vocab_size)
    engine = make_engine(model, args, args.max_running)
    warm = random.Random(5)
    run_all(engine, [(random_ids(warm, model.config.vocab_size, warm.randint(64, 2048)), 16)
                     for _ in range(min(32, args.requests))])
    before = engine.stats()
    tokens, wall, _ = run_all(engine, requests)
    stats = engine.stats()
    generated = sum(map(len, tokens))
    prompt_tokens = sum(len(p) for p, _ in requests)
    cont = dict(base, bench="continuous", requests=len(requests), max_running=args.max_running,
                max_step_tokens=args.max_step_tokens, prompt_tokens=prompt_tokens,
                generated_tokens=generated, wall_s=round(wall, 3),
                tok_s=round(generated / wall, 1),
                steps=stats["steps"] - before["steps"],
                preemptions=stats["preemptions"] - before["preemptions"],
                computed_tokens=stats["computed_tokens"] - before["computed_tokens"],
                graph_replays=stats["graph_replays"] - before["graph_replays"])
    emit(cont)
    log(f"continuous: {cont['tok_s']} tok/s over {len(requests)} requests in {wall:.1f} s")
    engine.close()
    del engine
    release_memory()

    subset = requests[:args.one_by_one]
    if not subset:
        return
    generate(model, subset[0][0][:64], 8, stop_ids=[])  # warm-up
    start = now()
    sub_tokens = sum(len(generate(model, p, m, stop_ids=[])) for p, m in subset)
    sub_wall = now() - start
    # Scale the measured time to every request by their prompt and output tokens (prefill and
    # decode time per token taken as the subset's).
    scale = sum(len(p) + m for p, m in requests) / sum(len(p) + m for p, m in subset)
    one = dict(base, bench="one_by_one", measured_requests=len(subset), requests=len(requests),
               measured_tokens=sub_tokens, measured_s=round(sub_wall, 3),
               tok_s=round(sub_tokens / sub_wall, 1),
               extrapolated_s=round(sub_wall * scale, 1),
               speedup=round(cont["tok_s"] / (sub_tokens / sub_wall), 2))
    emit(one)
    log(f"one by one: {one['tok_s']} tok/s on {len(subset)} requests; speed-up {one['speedup']}x")


def ttft(engine, prompt) -> float:
    """Seconds from adding the request to the step that gives its first token; then aborted."""
    start = now()
    rid = engine.add_request(prompt, GREEDY, max_new_tokens=4, stop_ids=[])
    while True:
        outs = engine.step()
        if any(o.request_id == rid and o.new_tokens for o in outs):
            break
    elapsed = now() - start
    engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    return elapsed


def prefix_section(model, args, base):
    engine = make_engine(model, args, 8)
    rng = random.Random(args.seed + 2)
    vocab = model.config.vocab_size
    prefix = random_ids(rng, vocab, args.prefix_len)
    ttft(engine, prefix + random_ids(rng, vocab, 16))  # puts the prefix in the cache
    ttft(engine, random_ids(rng, vocab, args.prefix_len + 16))  # warm-up of the long prefill
    hits, misses = [], []
    for _ in range(args.repeats):
        before = engine.stats()["prefix_hit_tokens"]
        hits.append(ttft(engine, prefix + random_ids(rng, vocab, 16)))
        hit_tokens = engine.stats()["prefix_hit_tokens"] - before
        misses.append(ttft(engine, random_ids(rng, vocab, args.prefix_len + 16)))
    row = dict(base, bench="prefix_ttft", prefix=args.prefix_len, suffix=16,
               cached_tokens=hit_tokens, hit_ttft_ms=round(1e3 * statistics.median(hits), 2),
               miss_ttft_ms=round(1e3 * statistics.median(misses), 2),
               hit_runs_ms=[round(1e3 * t, 2) for t in hits])
    row["ratio"] = round(row["miss_ttft_ms"] / row["hit_ttft_ms"], 1)
    emit(row)
    log(f"TTFT: {row['hit_ttft_ms']} ms with {hit_tokens} cached tokens, "
        f"{row['miss_ttft_ms']} ms without")
    engine.close()


def top2_gap(model, prompt, tokens, at) -> float:
    cache = new_cache(model, len(prompt) + at + 1)
    seq = cache.new_sequence()
    logits = forward(model, cache, seq, prompt + tokens[:at])[-1]
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def agreement_section(model, args, base):
    requests = [(p, min(m, 128)) for p, m in mixed_requests(args, model.config.vocab_size)]
    requests = requests[:args.agree]
    engine = make_engine(model, args, args.max_running)
    batched, _, _ = run_all(engine, requests)
    engine.close()
    del engine
    release_memory()
    same, parts = 0, []
    for (prompt, m), got in zip(requests, batched):
        alone = generate(model, prompt, m, stop_ids=[])
        if got == alone:
            same += 1
            continue
        at = next(i for i, (a, b) in enumerate(zip(got, alone)) if a != b)
        parts.append(dict(first_divergence=at, top2_gap=round(top2_gap(model, prompt, alone, at),
                                                               5)))
    emit(dict(base, bench="agreement", requests=len(requests), new_tokens_max=128,
              identical=same, diverged=parts))
    log(f"agreement: {same} of {len(requests)} identical to the single-sequence run")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama3-8b")
    ap.add_argument("--backend", default=None, help="default: cuda if it runs here, else triton")
    ap.add_argument("--int8", action="store_true", help="INT8 weights")
    ap.add_argument("--kv-cache", default=None, choices=[None, "int8"])
    ap.add_argument("--sections", default="static,continuous,prefix,agreement")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--one-by-one", type=int, default=16,
                    help="how many of the requests to run one after another (0: none)")
    ap.add_argument("--max-running", type=int, default=64)
    ap.add_argument("--max-step-tokens", type=int, default=2048)
    ap.add_argument("--memory-fraction", type=float, default=0.9)
    ap.add_argument("--prefix-len", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--agree", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--static-mixed", action=argparse.BooleanOptionalAction, default=None,
                    help="steps with prefill chunks padded to static shapes, from CUDA graphs "
                         "(LLMEngine static_mixed; default: with graphs)")
    args = ap.parse_args()
    if args.backend is None:
        from tileinfer.backend.registry import list_backends

        usable = {b.name for b in list_backends() if b.available}
        args.backend = "cuda" if "cuda" in usable else "triton"
    model = random_model(shape_config(args.shape), backend=args.backend,
                         quantize="int8" if args.int8 else None, max_len=args.max_len)
    base = dict(shape=args.shape, backend=args.backend, weights="int8" if args.int8 else "bf16",
                kv_cache=args.kv_cache or "bf16",
                gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    sections = {"static": static_section, "continuous": continuous_section,
                "prefix": prefix_section, "agreement": agreement_section}
    for name in args.sections.split(","):
        log(f"-- {name}")
        sections[name](model, args, base)
        release_memory()


if __name__ == "__main__":
    main()
