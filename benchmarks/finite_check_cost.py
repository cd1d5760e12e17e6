"""What the check for non-finite logits (engine/runtime/finite.py) adds to a decode step, in the
form a path issues it on a backend without the optional ``sample_tokens_with_sums`` op (cuda,
triton and ref have it and add the sums up inside their sampling kernel instead), against the
step it rides on:

- a single sequence (ModelRunner): ``torch.sum`` of the sampled row's logits into a kept
  float32, inside the step's CUDA graph (its kernel time, from graph replays);
- the batched engine (BatchRunner.sample): the rows' sums and their copy to the host, issued
  eagerly after each step (host and GPU time of the two launches, timed back to back with the
  GPU otherwise idle, so neither hides behind the other);
- the step: `tileinfer bench`'s decode figure for the same shape and batch, run beside it
  (benchmarks/gpu_run.sh finite).

    python benchmarks/finite_check_cost.py --shape llama3-8b --batches 1,64

One JSON object per line: the check's microseconds per step for each batch.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from tileinfer.model.random_weights import shape_config
from timing import time_op


def graph_sum_us(vocab: int) -> float:
    """Kernel time of the single-sequence form: one row's sum into a kept buffer."""
    logits = torch.randn((4, vocab), device="cuda")  # a step's logits (several rows: verify)
    total = torch.zeros(1, device="cuda")
    return time_op(lambda i: torch.sum(logits[-1:], dim=1, out=total)) * 1e6


def eager_sums_us(rows: int, vocab: int, reps: int = 200) -> float:
    """Wall time of the batched form: the rows' sums and their non-blocking copy to the host,
    issued as BatchRunner.sample issues them, per step (the mean of reps, synchronized)."""
    logits = torch.randn((rows, vocab), device="cuda")
    for _ in range(10):
        logits.sum(dim=1).to("cpu", non_blocking=True)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        logits.sum(dim=1).to("cpu", non_blocking=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama3-8b")
    parser.add_argument("--batches", default="1,64")
    args = parser.parse_args()
    vocab = shape_config(args.shape).vocab_size
    for batch in (int(b) for b in args.batches.split(",")):
        row = {"shape": args.shape, "batch": batch, "vocab": vocab,
               "single_sequence_graph_us": round(graph_sum_us(vocab), 2) if batch == 1 else None,
               "batched_eager_us": round(eager_sums_us(batch, vocab), 2)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
