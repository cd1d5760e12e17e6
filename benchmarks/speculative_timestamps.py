"""Where a short speculative generation spends its time: per-token host timestamps of plain
decoding and of n-gram speculation, on random weights of SmolLM2-135M's shape, a prompt of
``--prompt-len`` random tokens (it never repeats, so nothing is drafted) and ``--new-tokens``
tokens; the two kinds of run alternate, each after a garbage collection, 7 of each after 2
warm-ups. One JSON line per kind: total, first token and the medians of the gaps between tokens,
in ms.

    python benchmarks/speculative_timestamps.py --backend cuda
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time

import torch
from tileinfer import ModelRunner, NgramProposer, SamplingParams, SpecStats, generate_into
from tileinfer.engine.kv.cache import new_cache
from tileinfer.model.config import config_from_dict
from tileinfer.model.random_weights import random_model

SMOLLM2 = dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
               intermediate_size=1536, vocab_size=49152, model_type="llama", rms_norm_eps=1e-5,
               rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True,
               eos_token_id=2)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="cuda")
    p.add_argument("--prompt-len", type=int, default=250)
    p.add_argument("--new-tokens", type=int, default=15)
    args = p.parse_args()
    model = random_model(config_from_dict(SMOLLM2), dtype=torch.bfloat16, backend=args.backend,
                         device="cuda", max_len=2048)
    cache = new_cache(model, args.prompt_len + args.new_tokens + 64)
    runner = ModelRunner(model, cache)
    rng = random.Random(0)
    prompt = [rng.randrange(100, 49000) for _ in range(args.prompt_len)]

    def run(proposer):
        seq, stamps = cache.new_sequence(), []
        torch.cuda.synchronize()
        t = time.perf_counter()
        generate_into(runner, seq, prompt, args.new_tokens, SamplingParams(), stop_ids=[],
                      seed=0, speculative=proposer, spec_stats=SpecStats(),
                      on_token=lambda _: stamps.append(time.perf_counter() - t))
        torch.cuda.synchronize()
        total = time.perf_counter() - t
        cache.release(seq)
        return total, stamps

    for _ in range(2):
        run(None)
        run(NgramProposer(k=7))
    runs = {"plain": [], "ngram": []}
    for _ in range(7):
        gc.collect()
        runs["plain"].append(run(None))
        gc.collect()
        runs["ngram"].append(run(NgramProposer(k=7)))
    for kind, timed in runs.items():
        gaps = [statistics.median(s[i + 1] - s[i] for _, s in timed)
                for i in range(args.new_tokens - 1)]
        print(json.dumps(dict(backend=args.backend, kind=kind,
                              total_ms=round(statistics.median(t for t, _ in timed) * 1e3, 3),
                              first_token_ms=round(statistics.median(s[0] for _, s in timed) * 1e3, 3),
                              gaps_ms=[round(g * 1e3, 3) for g in gaps])), flush=True)


if __name__ == "__main__":
    main()
