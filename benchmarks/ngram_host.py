"""Where the n-gram loop's time goes on short answers (real SmolLM2, one backend).

After ``warm_up`` with the n-gram proposer: for rewrite, short_qa and quote_answer, twelve
``generate`` calls plainly and with ``speculative=NgramProposer()`` (medians of the last ten),
then the host's seconds per call in each part of the pipelined loop (timers around its
methods: planning, launching, reading, which waits for the device, emitting), and a cProfile
of ten n-gram calls of rewrite.

    python benchmarks/ngram_host.py cuda
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from speculative import PROMPTS  # noqa: E402
from timing import time_methods  # noqa: E402

import tileinfer as ti  # noqa: E402
from tileinfer.engine.generation.speculative import pipelined  # noqa: E402

PHASES = ("_plan", "_launch", "_read", "_emit", "_finish", "run")


def main():
    backend = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    folder = ti.default_model_dir()
    model = ti.load_model(folder, backend=backend)
    tokenizer = ti.load_tokenizer(folder)
    ti.warm_up(model, speculative=ti.NgramProposer())
    phases = time_methods(pipelined._Loop, PHASES, {})
    texts = {name: text for name, _, text in PROMPTS}

    def call(ids, ngram: bool):
        return ti.generate(model, ids, 128, seed=0,
                           speculative=ti.NgramProposer() if ngram else None)

    for name in ("rewrite", "short_qa", "quote_answer"):
        ids = tokenizer.encode(ti.chat_prompt(folder, [ti.ChatMessage("user", texts[name])]),
                               add_special_tokens=False)
        times = {False: [], True: []}
        for _ in range(12):
            for ngram in (False, True):
                torch.cuda.synchronize()
                start = time.perf_counter()
                out = call(ids, ngram)
                torch.cuda.synchronize()
                times[ngram].append(time.perf_counter() - start)
        phases.clear()
        for _ in range(10):
            call(ids, True)
        plain, ngram = (statistics.median(times[k][2:]) * 1e3 for k in (False, True))
        print(f"{backend} {name}: {len(out)} tokens, plain {plain:.2f} ms, ngram {ngram:.2f} ms "
              f"({plain / ngram:.3f}x); host per call: " + ", ".join(
                  f"{k} {s / 10 * 1e3:.2f} ms/{n // 10}" for k, (s, n) in phases.items()))
        if name == "rewrite":
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(10):
                call(ids, True)
            profile.disable()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(22)
            print("\n".join(line for line in text.getvalue().splitlines() if line.strip()))


if __name__ == "__main__":
    main()
