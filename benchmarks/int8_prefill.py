"""INT8 products of prefill sizes on the CUDA backend: gemm.cu against int8_cublas.py (the weight
converted to bf16 in chunks, or whole; cuBLAS's float32 sums, scaled once), beside the bf16
weight on cuBLAS, per llama3-8b matrix and row count: milliseconds a product (timing.time_op:
CUDA graphs of 20 products on rotated inputs, median of replays), and each INT8 path's largest
difference from the ref backend's product on the same inputs, over the bf16 tolerance's bound.
One JSON line per matrix and row count, with where int8_cublas's time goes: cuBLAS's float32
sums of the bf16 weight, and the weight's conversion to bf16 (elementwise.cu's, and PyTorch's
cast for comparison).

    python benchmarks/int8_prefill.py --rows 128,256,512,1024,2048
"""

from __future__ import annotations

import argparse
import json

import torch

from timing import time_op

MATRICES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (2 * 14336, 4096),
            "down": (4096, 14336)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="128,256,512,1024,2048")
    p.add_argument("--matrices", default=",".join(MATRICES))
    args = p.parse_args()

    from tileinfer.backend import get_backend
    from tileinfer.testing.conformance.helpers import TOLERANCE
    from tileinfer_backend_cuda.ops import elementwise, int8_cublas, tuning

    cuda, ref = get_backend("cuda"), get_backend("ref")
    chunk_bytes = int8_cublas.CHUNK_BYTES
    atol, rtol = TOLERANCE[torch.bfloat16]
    g = torch.Generator(device="cuda").manual_seed(0)
    for name in args.matrices.split(","):
        o_rows, k = MATRICES[name]
        w16 = (torch.randn(o_rows, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        scale = w16.float().abs().amax(1) / 127
        w8 = torch.round(w16.float() / scale[:, None]).clamp(-127, 127).to(torch.int8)
        for n in (int(r) for r in args.rows.split(",")):
            xs = [torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
                  for _ in range(4)]
            out = torch.empty(n, o_rows, device="cuda", dtype=torch.bfloat16)
            expected = torch.empty_like(out)
            ref.linear(expected, xs[0], w8, scale)
            row = {"matrix": name, "rows": n}
            for path, settings, chunk in (
                    ("gemm_cu", {"int8_cublas_min_rows": 1 << 30}, chunk_bytes),
                    ("int8_cublas", {"int8_cublas_min_rows": 1}, chunk_bytes),
                    ("int8_cublas_unchunked", {"int8_cublas_min_rows": 1}, 1 << 40)):
                int8_cublas.CHUNK_BYTES = chunk
                with tuning.experiment(settings):
                    cuda.linear(out, xs[0], w8, scale, False)
                    bound = atol + rtol * expected.float().abs()
                    row[f"{path}_err"] = round(float(((out.float() - expected.float()).abs()
                                                      / bound).max()), 3)
                    row[f"{path}_ms"] = round(1e3 * time_op(
                        lambda i: cuda.linear(out, xs[i % 4], w8, scale, False)), 4)
            int8_cublas.CHUNK_BYTES = chunk_bytes
            row["bf16_cublas_ms"] = round(1e3 * time_op(
                lambda i: cuda.linear(out, xs[i % 4], w16, None, False)), 4)
            # where int8_cublas's time goes: cuBLAS's float32 sums of the bf16 weight, and the
            # weight's conversion to bf16 (PyTorch's cast: what int8_cublas.py ran before)
            sums = torch.empty(n, o_rows, device="cuda")
            row["bf16_f32_sums_ms"] = round(1e3 * time_op(
                lambda i: torch.mm(xs[i % 4], w16.t(), out_dtype=torch.float32, out=sums)), 4)
            row["torch_cast_ms"] = round(1e3 * time_op(lambda i: w16.copy_(w8)), 4)
            row["convert_ms"] = round(1e3 * time_op(
                lambda i: elementwise.weight8_to_bf16(w16, w8)), 4)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
