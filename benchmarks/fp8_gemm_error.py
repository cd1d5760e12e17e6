"""How far the batched FP8 products land from ref's float32 sums: gemm_fp8.py's kernel at each
part length (the switch's "part_k": e4m3 k summed in the tensor cores before a float32 add) and
torch._scaled_mm (cuBLASLt), on llama3-8b's widths at n rows. Per product and kernel: the
bf16 outputs beyond the conformance suite's tolerance (atol = rtol = 0.02), the largest error
over that tolerance's bound, and the median relative error against ref's outputs.

    python3 benchmarks/fp8_gemm_error.py --rows 128
"""

from __future__ import annotations

import argparse
import json

import torch

from tileinfer.backend import get_backend
from tileinfer.testing.conformance.helpers import make_fp8_weight, run_linear_op

SHAPES = (("linear", 6144, 4096), ("linear", 4096, 14336), ("linear_swiglu", 14336, 4096),
          ("linear_xielu", 4096, 4096))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=128)
    p.add_argument("--part-k", default="64,128,256")
    args = p.parse_args()
    from tileinfer_backend_cuda.ops import tuning

    cuda, ref = get_backend("cuda"), get_backend("ref")
    variants = [("scaled_mm", {"enabled": False})]
    variants += [(f"wgmma part_k {k}", {"enabled": True, "part_k": int(k),
                                         "max_tokens": args.rows})
                 for k in args.part_k.split(",")]
    for op, rows, k_dim in SHAPES:
        g = torch.Generator().manual_seed(rows + k_dim)
        x = torch.randn(args.rows, k_dim, generator=g).to(torch.bfloat16).cuda()
        w, scale = make_fp8_weight(2 * rows if op == "linear_swiglu" else rows, k_dim, "cuda", g)
        expected = run_linear_op(ref, op, x, w, scale, rows, False).float()
        bound = 0.02 + 0.02 * expected.abs()
        for label, switch in variants:
            with tuning.experiment({"fp8_gemm": switch}):
                got = run_linear_op(cuda, op, x, w, scale, rows, False).float()
            err = (got - expected).abs()
            row = {"op": op, "rows": rows, "k": k_dim, "n": args.rows, "kernel": label,
                   "beyond_tolerance": int((err > bound).sum()),
                   "worst_over_bound": round(float((err / bound).max()), 3),
                   "median_relative": float((err / expected.abs().clamp_min(1e-3)).median())}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
