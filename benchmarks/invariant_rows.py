"""Each matrix of a step in the batch-invariant mode against cuBLAS, at chosen row counts.

For llama3-8b with random weights (LAYERS layers, the real shapes), times every layer's copy of
one matrix (qkv, o, the SwiGLU input, down) back to back in one CUDA graph, as the batch-invariant
mode runs it (``Invariance.BATCH``) and as torch.matmul does; one JSON row per row count and
matrix: milliseconds per layer and the ratio. 1,024 rows is the prefill of a static batch of 64
prompts of 16 tokens. ``--ncu``: instead, one call of each matrix between cudaProfilerStart and
Stop, for ``ncu --profile-from-start off``. The experiment switch (TILEINFER_CUDA_EXPERIMENTS)
chooses other launch settings.

    python benchmarks/invariant_rows.py --rows 64,1024
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
from batched_linear import matrix_calls
from timing import time_graph

from tileinfer.backend import get_backend
from tileinfer.backend.hookspecs import Invariance
from tileinfer.model.random_weights import random_model, shape_config

LAYERS = 4
MATRICES = ("qkv", "o", "gate_up", "down")


def profile_once(calls):
    for call in calls:  # compiled, then one call under the profiler
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    calls[0]()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="64,1024")
    p.add_argument("--backend", default="cuda")
    p.add_argument("--label", default="", help="a name for the rows (e.g. the settings)")
    p.add_argument("--ncu", action="store_true")
    args = p.parse_args()
    config = dataclasses.replace(shape_config("llama3-8b"), num_layers=LAYERS)
    model = random_model(config, backend="ref", max_len=256)
    ops = get_backend(args.backend)
    for n in [int(r) for r in args.rows.split(",")]:
        invariant = matrix_calls(model, ops, n, Invariance.BATCH)
        cublas = matrix_calls(model, None, n)
        for name in MATRICES:
            if args.ncu:
                profile_once(invariant[name])
                continue
            for call in invariant[name] + cublas[name]:
                call()
            ms_inv = time_graph(invariant[name]) * 1e3
            ms_cublas = time_graph(cublas[name]) * 1e3
            print(json.dumps(dict(label=args.label, rows=n, matrix=name, ms=round(ms_inv, 4),
                                  ms_cublas=round(ms_cublas, 4),
                                  ratio=round(ms_inv / ms_cublas, 3))), flush=True)


if __name__ == "__main__":
    main()
