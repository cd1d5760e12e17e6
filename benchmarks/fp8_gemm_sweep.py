"""gemm_fp8.py's launches (batched FP8 products on gemm_wgmma.cu) per matrix of a decode step at
n rows, against torch._scaled_mm: the kernel on its shipped settings (FP8_GEMM_TABLE's, else
gemm_settings' rule), and on each setting of a sweep (row warps, ring stages, runs, a stage's
products in flight, TMA or not; with ``--stream``, gemm_fp8_stream.cu's), each matrix's 32
layers back to back in one CUDA graph, the input's quantization included. One JSON line per
matrix: each variant's milliseconds and the weights' TB/s, the best settings; then the settings
that beat the shipped ones as ``FP8_GEMM_TABLE`` entries (ops/gemm_fp8.py).

    cd benchmarks && python3 fp8_gemm_sweep.py --shape llama3-8b --rows 64
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from batched_linear import matrix_calls, matrix_key, time_configs
from tileinfer.backend import get_backend
from tileinfer.model.random_weights import random_model, shape_config

MATRICES = ("qkv", "o", "gate_up", "down")


def configs(args) -> list[dict]:
    if args.stream:  # gemm_fp8_stream.cu's settings
        return [{"stream": True, "row_warps": w, "stream_stages": s, "stream_ctas": c,
                 "stream_boxes": b}
                for w, s, c, b in itertools.product(args.warps, args.stages, args.ctas, args.boxes)]
    out = []
    for warps, stages, runs, lag, tma in itertools.product(
            args.warps, args.stages, args.runs, (True, False), args.tma):
        out.append({"row_warps": warps, "stages": stages, "runs": runs, "mma_lag": lag,
                    "tma": tma})
    return out


def weight_bytes(model, name: str) -> int:
    rows, k_dim, _, epilogue = matrix_key(model, name)
    return model.config.num_layers * rows * k_dim * (2 if epilogue == "swiglu" else 1)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--warps", default="4,8", help="row warps a block (4 a warpgroup)")
    p.add_argument("--stages", default="3,4,6")
    p.add_argument("--runs", default="1,2,4,8")
    p.add_argument("--tma", default="1", help="weights by TMA (1), by cp.async (0), or both (0,1)")
    p.add_argument("--stream", action="store_true",
                   help="sweep gemm_fp8_stream.cu (row warps, --stages, --ctas) instead")
    p.add_argument("--ctas", default="1,2", help="with --stream: blocks a SM")
    p.add_argument("--boxes", default="1", help="with --stream: boxes of 128 k a stage")
    args = p.parse_args()
    for name in ("warps", "stages", "runs", "tma", "ctas", "boxes"):
        setattr(args, name, [int(v) for v in getattr(args, name).split(",")])
    args.tma = [bool(v) for v in args.tma]
    model = random_model(shape_config(args.shape), backend="ref", quantize="fp8", max_len=256)
    cuda = get_backend("cuda")
    calls = matrix_calls(model, cuda, args.rows)
    entries = {}
    for name in MATRICES:
        variants = [{"fp8_gemm": {"enabled": False}}, {}] + configs(args)  # scaled_mm, shipped
        on = {"enabled": True, "max_tokens": args.rows}
        enabled = lambda c: c if "fp8_gemm" in c else {"fp8_gemm": {**c, **on}}  # noqa: E731
        timed = time_configs(calls[name], variants, enabled)
        scaled_mm, shipped, swept = timed[1][0], timed[2][0], timed[3:]
        best_s, best = min(swept, key=lambda t: t[0])
        nbytes = weight_bytes(model, name)
        row = {"matrix": name, "rows": args.rows, "scaled_mm_ms": round(scaled_mm * 1e3, 4),
               "shipped_ms": round(shipped * 1e3, 4), "best_ms": round(best_s * 1e3, 4),
               "best": best,
               "scaled_mm_tb_s": round(nbytes / scaled_mm / 1e12, 2),
               "shipped_tb_s": round(nbytes / shipped / 1e12, 2),
               "best_tb_s": round(nbytes / best_s / 1e12, 2)}
        print(json.dumps(row), flush=True)
        if best_s < shipped:
            rows, k_dim, _, epilogue = matrix_key(model, name)
            entries[(rows, k_dim, epilogue)] = best
    for key, cfg in entries.items():
        print(f"    {key}: {cfg},")
    del calls
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
