"""Batch invariance at scale: random weights of a shape (default llama3-8b) loaded with
``batch_invariant=True``; REQUESTS greedy requests with prompts of 16..2,048 tokens and outputs
of 64..512, each run alone, then all of them together on engines of ``max_step_tokens`` 256 and
2,048 (chunked prefill beside decode rows). Every request's tokens and every step's logprobs
(its token's and the top 20, from the step's raw logits) must be the same bits together as
alone. Also: the first request again on an engine that already holds its prompt (a prefix-cache
hit) against the miss, and ``tileinfer.generate`` with n-gram speculation against plain.
One JSON object per line (progress on stderr); ``--cases`` picks some of them (``ngram`` alone
needs no run of every request alone).

    python benchmarks/determinism_engine.py --backend cuda [--cases together,prefix,ngram]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

import tileinfer as ti
from tileinfer import LLMEngine, NgramProposer, SamplingParams
from tileinfer.model.random_weights import random_model, shape_config

TOP = 20  # logprobs per step compared


def log(*parts):
    print(*parts, file=sys.stderr, flush=True)


def requests(n: int, vocab: int, max_prompt: int = 2048, max_new: int = 512,
             seed: int = 0) -> list[dict]:
    """n greedy requests: prompt lengths spread over 16..max_prompt, outputs over
    64..max_new (the first request the longest of both). Prompts repeat short phrases, so
    n-gram drafts find matches."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt_len = max_prompt if i == 0 else rng.randint(min(16, max_prompt), max_prompt)
        new = max_new if i == 0 else rng.randint(min(64, max_new), max_new)
        phrase = [rng.randrange(vocab) for _ in range(rng.randint(3, 12))]
        prompt = (phrase * (prompt_len // len(phrase) + 1))[:prompt_len]
        out.append(dict(prompt_ids=prompt, max_new_tokens=new, stop_ids=[],
                        sampling=SamplingParams(), logprobs=TOP))
    return out


def run(engine: LLMEngine, reqs: list[dict]) -> list[tuple]:
    """Each request's (tokens, logprobs) after stepping the engine to the end."""
    ids = [engine.add_request(**r) for r in reqs]
    got = {rid: ([], []) for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            if out.error is not None:
                raise RuntimeError(out.error)
            got[out.request_id][0].extend(out.new_tokens)
            got[out.request_id][1].extend(out.logprobs or [])
    return [got[rid] for rid in ids]


def mismatches(alone: list[tuple], together: list[tuple]) -> dict:
    tokens = sum(a[0] != b[0] for a, b in zip(alone, together))
    logprobs = sum(a[1] != b[1] for a, b in zip(alone, together))
    return {"requests": len(alone), "token_mismatches": tokens, "logprob_mismatches": logprobs}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--device", default="cuda")
    p.add_argument("--max-prompt", type=int, default=2048)
    p.add_argument("--max-new", type=int, default=512)
    p.add_argument("--cases", default="together,prefix,ngram",
                   help="together (both max_step_tokens), prefix, ngram")
    args = p.parse_args(argv)
    cases = set(args.cases.split(","))
    config = shape_config(args.shape)
    model = random_model(config, backend=args.backend, device=args.device,
                         max_len=args.max_prompt + args.max_new + 16, batch_invariant=True)
    reqs = requests(args.requests, config.vocab_size, args.max_prompt, args.max_new)
    base = {"shape": args.shape, "backend": args.backend}
    # one pool for every engine (the model's runtime keeps it): room for all requests at once
    pages = sum(-(-(len(r["prompt_ids"]) + r["max_new_tokens"]) // 16) for r in reqs) + 64

    started = time.perf_counter()
    single = LLMEngine(model, num_pages=pages)
    # every request alone for "together", the first one for "prefix"
    alone = [run(single, [r])[0] for r in (reqs if "together" in cases else
                                           reqs[:1] if "prefix" in cases else [])]
    log(f"alone: {len(alone)} requests in {time.perf_counter() - started:.1f} s")
    del single
    for step_tokens in ((min(256, args.max_prompt // 2), max(2048, args.max_prompt))
                        if "together" in cases else ()):
        started = time.perf_counter()
        together = run(LLMEngine(model, num_pages=pages, max_step_tokens=step_tokens), reqs)
        row = dict(base, case=f"together, max_step_tokens {step_tokens}",
                   seconds=round(time.perf_counter() - started, 1), **mismatches(alone, together))
        print(json.dumps(row), flush=True)

    if "prefix" in cases:
        engine = LLMEngine(model, num_pages=pages)
        run(engine, [reqs[0]])  # its prompt's pages now in the prefix cache
        hit = run(engine, [reqs[0]])
        row = dict(base, case="prefix-cache hit against the miss",
                   prefix_hit_tokens=engine.stats()["prefix_hit_tokens"],
                   **mismatches(alone[:1], hit))
        print(json.dumps(row), flush=True)
        del engine

    if "ngram" not in cases:
        return
    same, checked = 0, reqs[:8]
    for r in checked:
        plain = ti.generate(model, r["prompt_ids"], r["max_new_tokens"], stop_ids=[])
        spec = ti.generate(model, r["prompt_ids"], r["max_new_tokens"], stop_ids=[],
                           speculative=NgramProposer())
        same += plain == spec
    print(json.dumps(dict(base, case="n-gram speculation against plain (generate)",
                          requests=len(checked), equal=same)), flush=True)


if __name__ == "__main__":
    main()
