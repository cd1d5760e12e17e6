"""``tileinfer.generate_batch`` called twice, the second call timed: llama3-8b random weights on
cuda, prompts of 16 random tokens, 256 new. The measurement of ``user_paths.py --sections
batch``, in a script that imports only what every commit since the batched engine has
(``generate_batch``, ``random_model``), so that an older commit's wheels can run it beside
HEAD's on the same GPU.

    PYTHONPATH=SITE python benchmarks/batch_twice.py 8,32,64
"""

import random
import sys
import time

import torch

import tileinfer as ti
from tileinfer.model.random_weights import random_model, shape_config


def generate_twice(model, prompts) -> tuple[int, list[float]]:
    """The new tokens of one call and the seconds of each of two ``generate_batch`` calls."""
    seconds = []
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = ti.generate_batch(model, prompts, max_new_tokens=256, stop_ids=[], seeds=0)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return sum(map(len, out)), seconds


def main():
    model = random_model(shape_config("llama3-8b"), backend="cuda")
    rng = random.Random(0)
    for batch in map(int, sys.argv[1].split(",")):
        prompts = [[rng.randrange(model.config.vocab_size) for _ in range(16)]
                   for _ in range(batch)]
        tokens, seconds = generate_twice(model, prompts)
        print(f"batch B={batch}: second call {tokens / seconds[1]:.1f} tok/s "
              f"(first {tokens / seconds[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
