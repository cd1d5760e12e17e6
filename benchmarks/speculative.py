"""Speculative decoding on the GPU: speed and acceptance of the n-gram proposer, and the cost of a
verify step. Prints one JSON object per line.

(a) ``task`` rows: the real SmolLM2-135M-Instruct (the embedded default model, or ``--model``),
greedy, on an input-grounded task (repeat a paragraph with the names changed: most of the answer
is in the prompt) and on open chat. For each: plain decoding (CUDA graphs, pipelined) and
speculative decoding with ``NgramProposer(k)`` for each ``--ks``; tokens per second over the
whole generation (prefill included, median of ``--repeats``), the speed-up over plain, the
acceptance, and whether the output equals plain greedy token for token. Where it does not,
``first_divergence`` gives the index of the first different token and ``top2_gap_ulps`` how far
apart plain decoding's two best logits were there, in bf16 ulps of the larger one: a gap of 0-1
ulp is a near tie that the different summation order of a k+1-token step can flip.

(b) ``verify_cost`` rows: a random-weight llama3-8b-shaped model, a sequence of ``--context``
cached tokens, and the captured step of n = k + 1 tokens with all logits, for k = 0..8: GPU time
per replay (``step_ms``: CUDA events, median of 5 rounds of 20 replays) and its ratio to the
1-token step.

    python benchmarks/speculative.py                      # the fastest GPU backend
    python benchmarks/speculative.py --backend triton --skip-verify-cost
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from tileinfer.engine.cache import new_cache

# The paragraph is most of the answer: prompt lookup drafts well once the model copies it.
GROUNDED = (
    "Repeat this paragraph with the names changed:\n\n"
    "Alice met Bob at the train station on a cold Monday morning. Bob had brought two cups of "
    "coffee, one for himself and one for Alice, and together they waited for Carol, who was "
    "late as usual. When Carol finally arrived, she apologized and explained that her cat had "
    "hidden her keys under the sofa. Alice laughed and said that Carol's cat was the cleverest "
    "animal in the city. The three friends then boarded the train to the mountains, where Bob "
    "had rented a small cabin for the weekend. On the way, Alice read a book about birds, Bob "
    "slept, and Carol counted the tunnels until she lost track somewhere after twenty."
)
OPEN_CHAT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def emit(row):
    print(json.dumps(row), flush=True)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def top2_gap_ulps(model, prompt, tokens, index) -> float:
    """bf16 ulps between the best two logits that plain decoding saw before tokens[index]."""
    from tileinfer import forward

    cache = new_cache(model, len(prompt) + index + 1)
    logits = forward(model, cache, cache.new_sequence(), prompt + tokens[:index])[0]
    top = torch.topk(logits.float(), 2).values
    ulp = 2.0 ** (torch.floor(torch.log2(top[0].abs())) - 7)  # bf16 keeps 8 significant bits
    return float((top[0] - top[1]) / ulp)


def bench_task(model, name, prompt, stop_ids, ks, new_tokens, repeats):
    from tileinfer import ModelRunner, NgramProposer, SamplingParams, SpecStats, generate_into

    greedy = SamplingParams()
    cache = new_cache(model, len(prompt) + new_tokens + 16)
    runner = ModelRunner(model, cache)

    def run(proposer):
        seq = cache.new_sequence()
        stats = SpecStats()
        sync()
        start = time.perf_counter()
        out = generate_into(runner, seq, prompt, new_tokens, greedy, stop_ids=stop_ids, seed=0,
                            speculative=proposer, spec_stats=stats)
        sync()
        seconds = time.perf_counter() - start
        cache.release(seq)
        return out, seconds, stats

    def timed(make_proposer):
        run(make_proposer())  # warm-up: kernels compile, graphs are captured
        runs = [run(make_proposer()) for _ in range(repeats)]
        seconds = statistics.median(r[1] for r in runs)
        return runs[0][0], seconds, runs[0][2]

    plain, plain_s, _ = timed(lambda: None)
    base = dict(kind="task", task=name, backend=model.ops.name, prompt_tokens=len(prompt))
    emit(dict(base, mode="plain", generated=len(plain), seconds=plain_s,
              tok_s=len(plain) / plain_s))
    for k in ks:
        out, seconds, stats = timed(lambda: NgramProposer(k=k))
        row = dict(base, mode=f"ngram-k{k}", generated=len(out), seconds=seconds,
                   tok_s=len(out) / seconds, speedup=plain_s / seconds,
                   acceptance_rate=stats.acceptance_rate,
                   tokens_per_verify_step=stats.mean_accepted_length + 1,
                   verify_steps=stats.verify_steps, plain_steps=stats.plain_steps,
                   identical=out == plain)
        if out != plain:
            i = next((i for i, (a, b) in enumerate(zip(out, plain)) if a != b),
                     min(len(out), len(plain)))
            row.update(first_divergence=i)
            if i < len(plain):
                row.update(top2_gap_ulps=top2_gap_ulps(model, prompt, plain, i))
        emit(row)


def bench_tasks(args):
    from tileinfer import ChatMessage, chat_prompt, load_model, load_tokenizer
    from tileinfer.io.default_model import default_model_dir
    from tileinfer.io.generation_config import generation_defaults

    folder = args.model or default_model_dir()
    if str(folder).endswith(".gguf"):  # e.g. the SmolLM2 GGUF carried to the GPU machine
        from tileinfer import import_gguf

        folder = import_gguf(folder)
    model = load_model(folder, dtype=args.dtype, backend=args.backend, device=args.device,
                       max_len=2048)
    tokenizer = load_tokenizer(folder)
    _, stop_ids = generation_defaults(folder, model.config)
    for name, text in (("grounded", GROUNDED), ("open_chat", OPEN_CHAT)):
        prompt = tokenizer.encode(chat_prompt(folder, [ChatMessage("user", text)]),
                                  add_special_tokens=False)
        log(f"task {name}: {len(prompt)} prompt tokens")
        bench_task(model, name, prompt, stop_ids, args.ks, args.new_tokens, args.repeats)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bench_verify_cost(args):
    from tileinfer import ModelRunner
    from tileinfer.model.random_weights import random_model, shape_config

    model = random_model(shape_config(args.shape), dtype=args.dtype, backend=args.backend,
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
                graph = runner._all_logits_slots[n].graphs[None]
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


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", help="default: the fastest GPU backend")
    p.add_argument("--model", help="model folder or .gguf file (default: the embedded "
                   "SmolLM2-135M-Instruct)")
    # k + 1 <= 8: verify steps then run in the captured decode kernels, which compute each row
    # exactly as a 1-token step does (a 9-token step takes the prefill path).
    p.add_argument("--ks", default="4,7", help="n-gram drafts per step to try (default 4,7)")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--context", type=int, default=512, help="cached tokens for verify_cost")
    p.add_argument("--device", default="cuda", help="cuda (default); cpu for a smoke run")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--skip-tasks", action="store_true")
    p.add_argument("--skip-verify-cost", action="store_true")
    args = p.parse_args()
    from tileinfer.backend import default_backend_name

    args.backend = args.backend or default_backend_name()
    args.ks = [int(k) for k in args.ks.split(",")]
    args.dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    t0 = time.perf_counter()
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    emit(dict(kind="setup", device=args.device, gpu=gpu, backend=args.backend,
              torch=torch.__version__))
    if not args.skip_tasks:
        bench_tasks(args)
    if not args.skip_verify_cost:
        bench_verify_cost(args)
    log(f"done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
