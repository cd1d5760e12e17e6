"""cuBLAS against cuBLASLt for the llama3-8b linears at a batched step's row counts.

Steps of 17..64 rows in bf16 run on cuBLAS (``torch.matmul``; gemv.cu only ties it there).
This times, per matrix, plain ``torch.matmul`` against ``torch.addmm`` with a zero bias (PyTorch
then takes its cuBLASLt path), 32 weight copies (1 for the lm_head) called back to back in a
CUDA graph (``timing.time_graph``) so that the L2 cache holds none of them, and says whether
the two give the same bits.

    python benchmarks/cublas_rows.py --rows 32,64      # one JSON line per (rows, matrix)
"""

from __future__ import annotations

import argparse
import json

import torch
from timing import time_graph

# name -> (output rows, K): llama3-8b (gate_up: the gate and up rows of one product)
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336), "lm_head": (128256, 4096)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="32,64")
    args = p.parse_args()
    for rows in (int(r) for r in args.rows.split(",")):
        for name, (n_out, k) in SHAPES.items():
            copies = 1 if name == "lm_head" else 32
            weights = [torch.randn(n_out, k, device="cuda", dtype=torch.bfloat16) * 0.02
                       for _ in range(copies)]
            x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(rows, n_out, device="cuda", dtype=torch.bfloat16)
            zeros = torch.zeros(n_out, device="cuda", dtype=torch.bfloat16)
            plain = [lambda w=w: torch.matmul(x, w.t(), out=out) for w in weights]
            lt = [lambda w=w: torch.addmm(zeros, x, w.t(), out=out) for w in weights]
            for call in plain[:1] + lt[:1]:  # cuBLAS's first use (workspaces) before capture
                call()
            cublas_ms = time_graph(plain) * copies * 1e3  # all copies: a step's worth
            lt_ms = time_graph(lt) * copies * 1e3
            w = weights[0]
            same = torch.equal(torch.matmul(x, w.t()), torch.addmm(zeros, x, w.t()))
            print(json.dumps(dict(rows=rows, matrix=name, copies=copies,
                                  cublas_ms=round(cublas_ms, 4), cublaslt_ms=round(lt_ms, 4),
                                  same_bits=same)), flush=True)
            del weights


if __name__ == "__main__":
    main()
