"""Benchmarks of the CUDA backend's kernels on the GPU: ``python -m tileinfer_backend_cuda.bench``.

Prints one JSON document (and writes it to ``--out``), then a short table. Sections:

- ``copy``: device-to-device copy bandwidth (read + write), the ceiling for streaming kernels;
- ``gemv``: the decode GEMV (1 token) at the llama3-8b and llama3.2-1b matrix shapes, for the
  default configuration and a sweep of (warps, stages, L2 prefetch hint), against cuBLAS
  (torch.matmul) on the same weights; bf16 and INT8;
- ``attention``: decode attention (batch 1) at short and long contexts;
- ``sampling``: greedy and top-k/top-p sampling over a 128256-token vocabulary;
- ``gemm``: prefill GEMM (512 tokens), INT8 weights and float32 output, against cuBLAS bf16.

Timing: each measured call is repeated in one captured CUDA graph (no launch overhead from
Python), weights rotate over enough copies that nothing stays in the 50 MB L2, and the median
of several replays is reported.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

from . import compiler, ops

L2_BYTES = 50 * 2**20

LLAMA3_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
             "down": (4096, 14336), "lm_head": (128256, 4096)}
LLAMA3_1B = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048),
             "down": (2048, 8192), "lm_head": (128256, 2048)}


def time_graph(fn, reps: int = 20, replays: int = 7) -> float:
    """Median seconds per fn(i) call, with `reps` calls captured in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(2):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(times)


def bench_copy() -> dict:
    n = 2**30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    t = time_graph(lambda i: b.copy_(a), reps=10)
    return {"bytes": 2 * n, "seconds": t, "tb_per_s": 2 * n / t / 1e12}


def _weights(rows, cols, int8, copies):
    g = torch.Generator(device="cuda").manual_seed(rows + cols)
    ws = []
    for _ in range(copies):
        w = (torch.randn(rows, cols, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
        if int8:
            scale = w.float().abs().amax(1) / 127
            ws.append(((w.float() / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale))
        else:
            ws.append((w, None))
    return ws


def _copies(nbytes):
    return max(2, math.ceil(4 * L2_BYTES / nbytes))


def gemv_configs():
    configs = [None]  # the default heuristic
    for warps in (4, 8, 16):
        for stages in (2, 4, 6, 8):
            configs.append({"warps": warps, "stages": stages, "l2_256b": False})
    configs += [{"warps": w, "stages": 4, "l2_256b": True} for w in (8, 16)]
    return configs


def _precompile(jobs):
    """Compile GEMV variants in parallel processes into the disk cache before timing."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    arch = compiler.device_arch(torch.cuda.current_device())
    # fork: the children only run NVRTC (no CUDA calls), and start without importing torch again
    with ProcessPoolExecutor(max_workers=8, mp_context=multiprocessing.get_context("fork")) as pool:
        list(pool.map(_compile_job, [(arch, d) for d in jobs]))


def _compile_job(args):
    arch, defines = args
    compiler.compile_cubin("gemv.cu", arch, defines)


def bench_gemv(shapes: dict, int8: bool, sweep: bool) -> list[dict]:
    results = []
    x = torch.randn(1, max(c for _, c in shapes.values()), device="cuda").to(torch.bfloat16)
    device = torch.cuda.current_device()
    configs = gemv_configs() if sweep else [None]
    if sweep:
        jobs = []
        for name, (rows, cols) in shapes.items():
            epi = "swiglu" if name == "gate_up" else "none"
            out_dtype = "float" if name == "lm_head" else "bf16_t"
            for cfg in configs[1:]:
                d = {"W_INT8": int(int8), "INT8_LOAD": 16, "EPILOGUE": ops._EPILOGUES[epi],
                     "OUT_DTYPE": out_dtype, "ROUND_BF16": int(not int8), "WARPS": cfg["warps"],
                     "STAGES": cfg["stages"]}
                if cfg["l2_256b"]:
                    d["STREAM_L2_256B"] = None
                jobs.append(d)
        _precompile(jobs)
    for name, (rows, cols) in shapes.items():
        nbytes = rows * cols * (1 if int8 else 2)
        ws = _weights(rows, cols, int8, _copies(nbytes))
        xi = x[:, :cols]
        if name == "gate_up":
            out = torch.empty(1, rows // 2, dtype=torch.bfloat16, device="cuda")
            scratch = torch.empty(1, rows, dtype=torch.bfloat16, device="cuda")
            call = lambda w, s: ops.linear_swiglu(out, xi, w, s, scratch)  # noqa: E731
        else:
            dtype = torch.float32 if name == "lm_head" else torch.bfloat16
            out = torch.empty(1, rows, dtype=dtype, device="cuda")
            call = lambda w, s: ops.linear(out, xi, w, s)  # noqa: E731
        row = {"shape": name, "rows": rows, "cols": cols, "int8": int8, "weight_bytes": nbytes,
               "configs": []}
        for cfg in configs:
            ops.gemv_overrides.clear()
            if cfg is not None:
                limit = 227 * 1024
                parts = 2 * (2 if name == "gate_up" else 1) + (2 if int8 else 1)
                if cfg["warps"] * cfg["stages"] * parts * 512 > limit - 20 * 1024:
                    continue
                ops.gemv_overrides.update(cfg)
            chosen = ops.gemv_config(rows // 2 if name == "gate_up" else rows, cols, int8,
                                     "swiglu" if name == "gate_up" else "none", device)
            t = time_graph(lambda i: call(*ws[i % len(ws)]))
            row["configs"].append({"config": chosen, "default": cfg is None, "seconds": t,
                                   "tb_per_s": nbytes / t / 1e12})
        ops.gemv_overrides.clear()
        if not int8:  # cuBLAS on the same weights (separate GEMMs for gate/up are not fused)
            out2 = torch.empty(1, rows, dtype=torch.bfloat16, device="cuda")
            t = time_graph(lambda i: torch.matmul(xi, ws[i % len(ws)][0].t(), out=out2))
            row["cublas"] = {"seconds": t, "tb_per_s": nbytes / t / 1e12}
        best = max(row["configs"], key=lambda c: c["tb_per_s"])
        row["best"] = best["config"]
        row["best_tb_per_s"] = best["tb_per_s"]
        row["default_tb_per_s"] = row["configs"][0]["tb_per_s"]
        results.append(row)
        del ws
        torch.cuda.empty_cache()
    return results


def bench_attention() -> list[dict]:
    results = []
    heads, kv_heads, head_dim, page_size = 32, 8, 128, 16
    for kind in ("bf16", "int8"):
        for ctx in (272, 4096, 32768):
            pages = ctx // page_size + 1
            dtype = torch.int8 if kind == "int8" else torch.bfloat16
            shape = (pages, page_size, kv_heads, head_dim)
            if kind == "int8":
                k = torch.randint(-127, 128, shape, dtype=torch.int8, device="cuda")
                v = torch.randint(-127, 128, shape, dtype=torch.int8, device="cuda")
                ks = torch.rand(shape[:3], device="cuda") * 0.01
                vs = torch.rand(shape[:3], device="cuda") * 0.01
            else:
                k = torch.randn(shape, device="cuda").to(dtype)
                v = torch.randn(shape, device="cuda").to(dtype)
                ks = vs = None
            q = torch.randn(1, heads, head_dim, device="cuda").to(torch.bfloat16)
            out = torch.empty_like(q)
            cu = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
            lens = torch.tensor([ctx], dtype=torch.int32, device="cuda")
            table = torch.arange(pages, dtype=torch.int32, device="cuda")[None]
            ws = ops.attention_workspace(1, heads, head_dim, pages * page_size, "cuda")
            t = time_graph(lambda i: ops.attention(out, q, k, v, ks, vs, None, cu, lens, table, 1,
                                                   pages * page_size, head_dim ** -0.5, True, ws))
            kv_bytes = 2 * ctx * kv_heads * head_dim * k.element_size()
            results.append({"kind": kind, "context": ctx, "seconds": t,
                            "tb_per_s": kv_bytes / t / 1e12})
    return results


def bench_sampling() -> list[dict]:
    from tileinfer.sampling import SamplingParams

    results = []
    vocab = 128256
    logits = torch.randn(1, vocab, device="cuda") * 4
    out = torch.empty(1, dtype=torch.int32, device="cuda")
    seed = torch.tensor([1], device="cuda")
    counter = torch.tensor([0], device="cuda")
    for p in (SamplingParams(0.0), SamplingParams(0.8), SamplingParams(0.7, top_k=50),
              SamplingParams(0.8, top_p=0.9), SamplingParams(0.8, top_k=50, top_p=0.9)):
        t = time_graph(lambda i: ops.sample_tokens(out, logits, p.temperature, p.top_k, p.top_p,
                                                   seed, counter, None), reps=10)
        results.append({"params": str(p), "seconds": t})
    return results


def bench_gemm() -> list[dict]:
    results = []
    m, rows, cols = 512, 4096, 4096
    x = torch.randn(m, cols, device="cuda").to(torch.bfloat16)
    w = (torch.randn(rows, cols, device="cuda") * 0.02).to(torch.bfloat16)
    scale = w.float().abs().amax(1) / 127
    q = (w.float() / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    flops = 2 * m * rows * cols
    for label, weight, s, dtype in (("own bf16 -> fp32", w, None, torch.float32),
                                    ("own int8 -> bf16", q, scale, torch.bfloat16)):
        out = torch.empty(m, rows, dtype=dtype, device="cuda")
        t = time_graph(lambda i: ops._gemm(out, x, weight, s), reps=10)
        results.append({"kernel": label, "seconds": t, "tflop_per_s": flops / t / 1e12})
    out = torch.empty(m, rows, dtype=torch.bfloat16, device="cuda")
    t = time_graph(lambda i: torch.matmul(x, w.t(), out=out), reps=10)
    results.append({"kernel": "cuBLAS bf16", "seconds": t, "tflop_per_s": flops / t / 1e12})
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--no-sweep", action="store_true", help="GEMV default configuration only")
    parser.add_argument("--sections", default="copy,gemv,attention,sampling,gemm")
    args = parser.parse_args(argv)
    sections = args.sections.split(",")
    t0 = time.time()
    report = {"device": torch.cuda.get_device_name(), "nvrtc": compiler.nvrtc_version(),
              "torch": torch.__version__}
    if "copy" in sections:
        report["copy"] = bench_copy()
    if "gemv" in sections:
        report["gemv"] = []
        for shapes_name, shapes in (("llama3-8b", LLAMA3_8B), ("llama3.2-1b", LLAMA3_1B)):
            for int8 in (False, True):
                for row in bench_gemv(shapes, int8, sweep=not args.no_sweep and shapes_name == "llama3-8b"):
                    row["model"] = shapes_name
                    report["gemv"].append(row)
    if "attention" in sections:
        report["attention"] = bench_attention()
    if "sampling" in sections:
        report["sampling"] = bench_sampling()
    if "gemm" in sections:
        report["gemm"] = bench_gemm()
    report["fallbacks"] = dict(ops.fallback_counts)
    report["wall_seconds"] = time.time() - t0
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    # the short table
    copy_bw = report.get("copy", {}).get("tb_per_s")
    if copy_bw:
        print(f"\ncopy {copy_bw:.2f} TB/s")
    for row in report.get("gemv", []):
        cub = row.get("cublas", {}).get("tb_per_s")
        print(f"gemv {row['model']:12s} {row['shape']:8s} {'int8' if row['int8'] else 'bf16'}: "
              f"default {row['default_tb_per_s']:.2f} TB/s, best {row['best_tb_per_s']:.2f} "
              f"{row['best']}" + (f", cuBLAS {cub:.2f}" if cub else ""))
    for row in report.get("attention", []):
        print(f"attention {row['kind']} ctx {row['context']}: {row['seconds'] * 1e6:.1f} us")
    for row in report.get("sampling", []):
        print(f"sampling {row['params']}: {row['seconds'] * 1e6:.1f} us")
    for row in report.get("gemm", []):
        print(f"gemm {row['kernel']}: {row['tflop_per_s']:.0f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
