"""A few launches of one batch-invariant product on the CUDA backend, for a profiler to catch
(``ncu -k regex:gemm_invariant -s 2 -c 1 ...``): a random bf16 weight of --shape rows x K and a
--rows-row input, run through ``linear`` --calls times. ``--fp8``: the weight in e4m3 with its row
scales (model/quant.py), on the default path (gemm_fp8.py's kernel, ``gemm_wgmma``, up to 64 rows).

``--path gemm='{"stage_steps": 2, "blocked": true}'`` runs gemm_invariant.cu under those
experiment settings (``min_rows`` 1), ``--path gemv`` the shipped invariant path (gemv.cu while
INVARIANT_GEMM_TABLE holds no such weight), ``--path default`` the default path (cuBLAS).

    ncu --clock-control none -k regex:gemm_invariant -s 2 -c 1 --section SpeedOfLight \\
        python3 benchmarks/invariant_launch.py --path 'gemm={"stage_steps": 2}'
    ncu --clock-control none -k regex:gemm_wgmma -s 2 -c 1 --section SpeedOfLight \\
        python3 benchmarks/invariant_launch.py --fp8 --shape 4096x14336
"""

from __future__ import annotations

import argparse
import json

import torch
from tileinfer.backend.hookspecs import Invariance
from tileinfer.backend.registry import get_backend
from tileinfer.model.quant import linear_operands, quantize_linear


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="6144x4096", help="weight rows x K (llama3-8b's qkv)")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--path", default="gemv", help="gemm=JSON, gemv or default")
    p.add_argument("--fp8", action="store_true", help="e4m3 weights, the default path")
    args = p.parse_args()
    from tileinfer_backend_cuda.ops import tuning

    o_rows, k_dim = (int(v) for v in args.shape.split("x"))
    cuda = get_backend("cuda")
    w = (torch.randn(o_rows, k_dim, device="cuda") * 0.02).to(torch.bfloat16)
    x = torch.randn(args.rows, k_dim, device="cuda").to(torch.bfloat16)
    out = torch.empty(args.rows, o_rows, dtype=torch.bfloat16, device="cuda")
    settings = {}
    if args.path.startswith("gemm="):
        settings = {"invariant_gemm": {"min_rows": 1, **json.loads(args.path[5:])}}
    invariance = None if args.path == "default" or args.fp8 else Invariance.BATCH
    weight, scale = linear_operands(quantize_linear(w, "fp8" if args.fp8 else None))
    with tuning.experiment(settings):
        for _ in range(args.calls):
            cuda.linear(out, x, weight, scale, batch_invariant=invariance)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
