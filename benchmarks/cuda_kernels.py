"""Benchmarks of the CUDA backend's kernels on the GPU, from the repository root:

    python3 benchmarks/cuda_kernels.py [--out OUT.json] [--no-sweep] [--sections gemv,attention]
    python3 benchmarks/cuda_kernels.py --table OUT.json    # the table of a saved run
    python3 benchmarks/cuda_kernels.py --check             # the sweeps' sanity checks (no GPU)

Prints one JSON line (the sweeps' per-configuration rows only in the ``--out`` file), then a
short table (fractions are of the measured copy bandwidth). About two minutes on an H200 with the
sweeps (``--no-sweep``: the default configurations only). Sections:

- ``copy``: device-to-device copy bandwidth (read + write), the ceiling for streaming kernels;
- ``gemv``: the decode GEMV (1 token) at the llama3-8b and llama3.2-1b matrix shapes, bf16 and
  INT8, for the default configuration of both kernel families ("rows", gemv_rows.cu, the shipped
  one, and "mma", gemv.cu, with MMA_GEMV_TABLE below), a sweep of the mma kernel's (warps,
  stages, L2 prefetch hint) and of the rows kernel's (rows, unroll, warps, split_k) around its
  default, against cuBLAS (torch.matmul) on the same weights; the GEMV time per decode token of
  each model; the winners of each family as ``MMA_GEMV_TABLE`` / ``GEMV_ROWS_TABLE``
  (ops/tuning.py) entries;
- ``layers``: a layer's decode chain without attention (norms and the four GEMVs, as the model
  launches them), plain and with programmatic dependent launch;
- ``attention``: decode attention (batch 1; one token, and an 8-token verify step at 8192 keys)
  at the llama3-8b and llama3.2-1b head shapes, bf16 and INT8 pages, 272 to 32768 keys, on the
  decode path (attention_decode.cu, "new") and on attention.cu ("old"), with sweeps of
  ``tuning.ATTN_CONFIG`` (split target, K/V ring depth: the decode path's everywhere,
  attention.cu's from 8192 keys up); new over old, and INT8 over bf16;
- ``sampling``: greedy and top-k/top-p sampling over a 128256-token vocabulary;
- ``gemm``: prefill GEMM (512 tokens), INT8 weights and float32 output, against cuBLAS bf16.

Configurations other than the shipped ones are set through the backend's one benchmark-only
switch (``tuning.experiment``, the ``TILEINFER_CUDA_EXPERIMENTS`` setting, which also applies to
a whole run from the environment). Timing: each measured call is repeated in one captured CUDA
graph (timing.py; no launch overhead from Python), weights and KV caches rotate over enough
copies that nothing stays in the 50 MB L2, and the median of several replays is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time

import timing
import torch
from tileinfer.backend.types import AttentionStep, LayerKV
from tileinfer_backend_cuda import compiler
from tileinfer_backend_cuda.ops import attention as attn_ops
from tileinfer_backend_cuda.ops import common, linear, norm, sampling, tuning

L2_BYTES = 50 * 2**20

LLAMA3_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
             "down": (4096, 14336), "lm_head": (128256, 4096)}
LLAMA3_1B = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048),
             "down": (2048, 8192), "lm_head": (128256, 2048)}


# The mma GEMV's (gemv.cu's) per-shape configurations: the winners of this benchmark's sweep on
# an H200 (benchmarks/RESULTS.md, "CUDA backend check and sweep"), shipped in ops/tuning.py.
MMA_GEMV_TABLE = tuning.MMA_GEMV_TABLE


def experiment(**changes):
    """tuning.experiment with ``changes`` over the experiments in force (those of the environment,
    TILEINFER_CUDA_EXPERIMENTS, for the whole run)."""
    return tuning.experiment({**tuning.experiments, **changes})


def time_graph(fn, reps: int = 20, replays: int = 7) -> float:
    """Median seconds per fn(i) call, with `reps` calls captured in one CUDA graph (two warm-up
    calls first, on a side stream: compiles and first-use allocations stay out of the capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(2):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    return timing.time_graph([lambda i=i: fn(i) for i in range(reps)], replays)


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


# Layers of each model: the per-token GEMV time is layers x (qkv + o + gate_up + down) + lm_head.
LAYERS = {"llama3-8b": 32, "llama3.2-1b": 16}
MODELS = {"llama3-8b": LLAMA3_8B, "llama3.2-1b": LLAMA3_1B}

# Shared memory a GEMV ring may take (227 KB per block, less the static reduction buffer).
GEMV_RING_LIMIT = 200 * 1024


def gemv_configs():
    """The sweep: warps splitting K x ring stages, and the L2 256-byte prefetch hint on a few."""
    configs = [{"warps": w, "stages": s, "l2_256b": False}
               for w in (2, 4, 8, 16) for s in (2, 3, 4, 6, 8)]
    configs += [{"warps": w, "stages": s, "l2_256b": True} for w, s in ((4, 4), (8, 4), (16, 4))]
    return configs


def gemv_rows_configs(o_rows, k_dim, int8, epilogue, device, wide=False):
    """The rows kernel's sweep at one shape (about 8-12 configurations): the tile (rows x unroll,
    the same 8 weight chunks a lane per round, and two smaller ones) at the default parallelism
    along K, and the parallelism (warps of a block x grid splits: half, once, twice and four
    times the default's, each as warps first and as splits first) at the default tile; wide:
    also every tile at 1, 2, 4 and 8 warps without a grid split (about 30 configurations).
    Configurations that launch the same kernel (splits reduced by a short K), give a warp no step
    or do not fit the split-K scratch are left out."""
    default = tuning.gemv_config(o_rows, k_dim, int8, epilogue, device, kernel="rows")
    mats = 2 if epilogue == "swiglu" else 1
    tiles = [(rows // mats, unroll) for rows, unroll in ((4, 2), (2, 4), (8, 1), (2, 2), (4, 1))
             if rows // mats >= 1]
    par0 = default["warps"] * default["split_k"]
    steps = -(-k_dim // (32 * tuning.rows_lane_k(int8)))
    candidates = [{key: default[key] for key in ("rows", "unroll", "warps", "split_k")}]
    candidates += [{"rows": r, "unroll": u, "warps": default["warps"], "split_k": default["split_k"]}
                   for r, u in tiles]
    if wide:
        candidates += [{"rows": r, "unroll": u, "warps": w, "split_k": 1}
                       for r, u in tiles for w in (1, 2, 4, 8)]
    for par in sorted({max(1, par0 // 2), par0, 2 * par0, 4 * par0}):
        # the split of K inside the block first, then the grid's split first
        warps_first = min(par, 8)
        split_first = max(1, par // 4)
        for warps in dict.fromkeys((warps_first, split_first)):
            candidates.append({"rows": default["rows"], "unroll": default["unroll"],
                               "warps": warps, "split_k": par // warps})
    configs, seen = [], set()
    for cfg in candidates:
        splits, _ = tuning.gemv_rows_split(cfg, k_dim, int8)
        key = (cfg["rows"], cfg["unroll"], cfg["warps"], splits)
        if (key in seen or cfg["warps"] * splits > steps
                or (splits > 1 and not common.GemvScratch.fits(splits, mats, o_rows))):
            continue
        seen.add(key)
        configs.append({**cfg, "split_k": splits})
    return configs


def mma_config(o_rows, k_dim, int8, epilogue, device) -> dict:
    """gemv.cu's configuration as this benchmark runs it by default: MMA_GEMV_TABLE's entry, else
    the backend's gemv_heuristic."""
    entry = MMA_GEMV_TABLE.get((o_rows, k_dim, bool(int8), epilogue), {})
    with experiment(gemv={"kernel": "mma", **entry}):
        return tuning.gemv_config(o_rows, k_dim, int8, epilogue, device)


def _shape_kind(name):
    """(epilogue, output dtype name) of a benchmarked matrix, as the model runs it."""
    if name == "gate_up":
        return "swiglu", "bf16_t"
    return "none", "bf16_t"  # the model's lm_head writes bf16 logits (then copies to float32)


def precompile(jobs):
    """Compile kernel variants in parallel processes into the disk cache before timing."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    arch = compiler.device_arch(torch.cuda.current_device())
    jobs = [(arch, f, d) for f, d in jobs]
    workers = max(1, min(16, (os.cpu_count() or 2) - 1))
    # fork: the children only run NVRTC (no CUDA calls), and start without importing torch again
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork")) as pool:
        list(pool.map(_compile_job, jobs, chunksize=4))


class _NotLoaded:
    """A kernel that recorded_builds kept from loading: its launches do nothing."""

    def kernel(self, name, signature):
        return self

    def launch(self, *args, **kwargs):
        pass


@contextlib.contextmanager
def recorded_builds(jobs: list):
    """Within: every kernel build the ops would load goes into ``jobs`` as (file, defines), once,
    and is neither compiled nor launched. A dry pass over a sweep's variants thus collects the
    builds that ``precompile`` then compiles in parallel, before the variants are timed."""
    seen = {json.dumps([f, d], sort_keys=True) for f, d in jobs}
    load_module = compiler.load_module

    def record(file, device_index, defines=None, extra_options=()):
        key = json.dumps([file, defines or {}], sort_keys=True)
        if key not in seen:
            seen.add(key)
            jobs.append((file, dict(defines or {})))
        return _NotLoaded()

    compiler.load_module = record
    try:
        yield jobs
    finally:
        compiler.load_module = load_module


def _compile_job(args):
    arch, file, defines = args
    compiler.compile_cubin(file, arch, defines, _EXTRA_OPTIONS.get(file, ()))


_EXTRA_OPTIONS = {"attention_decode.cu": attn_ops.DECODE_OPTIONS}  # as the ops compile them


def _family_best(row, kernel):
    timed = [c for c in row["configs"] if c["config"]["kernel"] == kernel]
    return max(timed, key=lambda c: c["tb_per_s"]) if timed else None


def bench_gemv(model: str, int8: bool, sweep: bool) -> list[dict]:
    """Every matrix of `model` at 1 token: the shipped configuration (GEMV_ROWS_TABLE or the
    heuristic), the mma family's (MMA_GEMV_TABLE or its heuristic) and, with sweep, every
    configuration of gemv_configs() that fits in shared memory (mma) and of gemv_rows_configs()
    (rows)."""
    shapes = MODELS[model]
    results = []
    x = torch.randn(1, max(c for _, c in shapes.values()), device="cuda").to(torch.bfloat16)
    device = torch.cuda.current_device()
    for name, (rows, cols) in shapes.items():
        epilogue, out_name = _shape_kind(name)
        o_rows = rows // 2 if epilogue == "swiglu" else rows
        nbytes = rows * cols * (1 if int8 else 2)
        ws = _weights(rows, cols, int8, _copies(nbytes))
        xi = x[:, :cols]
        if epilogue == "swiglu":
            out = torch.empty(1, o_rows, dtype=torch.bfloat16, device="cuda")
            scratch = torch.empty(1, rows, dtype=torch.bfloat16, device="cuda")
            call = lambda w, s: linear.linear_swiglu(out, xi, w, s, scratch)  # noqa: E731
        else:
            out = torch.empty(1, rows, dtype=torch.bfloat16, device="cuda")
            call = lambda w, s: linear.linear(out, xi, w, s)  # noqa: E731
        default = tuning.gemv_config(o_rows, cols, int8, epilogue, device)
        row = {"model": model, "shape": name, "rows": rows, "cols": cols, "int8": int8,
               "epilogue": epilogue, "weight_bytes": nbytes, "default": default, "configs": []}
        candidates = [None, mma_config(o_rows, cols, int8, epilogue, device)]
        if sweep:
            candidates += [{"kernel": "mma", **c} for c in gemv_configs()
                           if linear.gemv_ring_bytes(c, cols, int8, epilogue) <= GEMV_RING_LIMIT]
            candidates += [{"kernel": "rows", **c}
                           for c in gemv_rows_configs(o_rows, cols, int8, epilogue, device)]
        timed = []
        for cfg in candidates:
            with experiment(gemv=cfg or tuning.experiments["gemv"]):
                chosen = tuning.gemv_config(o_rows, cols, int8, epilogue, device)
                if chosen in timed:
                    continue
                timed.append(chosen)
                # every copy once per replay: what one replay reads does not fit in L2
                t = time_graph(lambda i: call(*ws[i % len(ws)]), reps=max(10, len(ws)), replays=5)
            row["configs"].append({"config": chosen, "default": cfg is None, "seconds": t,
                                   "tb_per_s": nbytes / t / 1e12})
        if not int8:  # cuBLAS on the same weights (gate and up as one matrix, no activation)
            out2 = torch.empty(1, rows, dtype=torch.bfloat16, device="cuda")
            t = time_graph(lambda i: torch.matmul(xi, ws[i % len(ws)][0].t(), out=out2),
                           reps=max(10, len(ws)), replays=5)
            row["cublas"] = {"seconds": t, "tb_per_s": nbytes / t / 1e12}
        best = max(row["configs"], key=lambda c: c["tb_per_s"])
        row["best"] = best["config"]
        row["best_seconds"] = best["seconds"]
        row["best_tb_per_s"] = best["tb_per_s"]
        for kernel in ("mma", "rows"):
            fam = _family_best(row, kernel)
            if fam is not None:
                row[f"best_{kernel}"] = fam["config"]
                row[f"best_{kernel}_seconds"] = fam["seconds"]
                row[f"best_{kernel}_tb_per_s"] = fam["tb_per_s"]
        row["default_seconds"] = row["configs"][0]["seconds"]
        row["default_tb_per_s"] = row["configs"][0]["tb_per_s"]
        results.append(row)
        ws = None  # free the copies before empty_cache
        torch.cuda.empty_cache()
    return results


_MMA_TABLE_KEYS = ("warps", "stages", "l2_256b")
_ROWS_TABLE_KEYS = ("rows", "unroll", "warps", "split_k")


def gemv_table(rows: list[dict], kernel: str = "mma") -> dict:
    """A family's winners as table entries, "(o_rows, K, int8, epilogue)" -> config:
    MMA_GEMV_TABLE (mma) or tuning.GEMV_ROWS_TABLE (rows)."""
    keys = _MMA_TABLE_KEYS if kernel == "mma" else _ROWS_TABLE_KEYS
    table = {}
    for row in rows:
        best = row.get(f"best_{kernel}")
        if best is None and kernel == "mma" and "kernel" not in row["best"]:
            best = row["best"]  # a run from before the rows kernel
        if best is None:
            continue
        o_rows = row["rows"] // 2 if row["epilogue"] == "swiglu" else row["rows"]
        key = f"({o_rows}, {row['cols']}, {row['int8']}, {row['epilogue']!r})"
        table[key] = {k: best[k] for k in keys}
    return table


def per_token(rows: list[dict], model: str, int8: bool, which: str) -> float:
    """Seconds of GEMV per decode token: layers x (qkv + o + gate_up + down) + lm_head."""
    t = {r["shape"]: r[f"{which}_seconds"] for r in rows
         if r["model"] == model and r["int8"] == int8 and f"{which}_seconds" in r}
    if len(t) < 5:
        return float("nan")
    return LAYERS[model] * (t["qkv"] + t["o"] + t["gate_up"] + t["down"]) + t["lm_head"]


# Attention shapes: (heads, kv_heads, head_dim) of the models.
ATTN_SHAPES = {"llama3-8b": (32, 8, 128), "llama3.2-1b": (32, 8, 64)}


def attention_configs():
    """The sweep of attention.cu (prefill, and decode steps with "decode" off): split target
    (blocks per SM) x K/V ring depth."""
    return [{"blocks_per_sm": b, "stages": s} for b in (1, 2, 3, 4, 6) for s in (2, 3)]


def attention_decode_configs():
    """The sweep of attention_decode.cu: split target x K/V ring depth (0: the deepest that fits
    that many blocks per SM, attention_decode_stages)."""
    return [{"decode_blocks_per_sm": b, "decode_stages": s} for b in (1, 2, 3, 4) for s in (0, 2, 3, 4)]


def _attention_config_name(cfg):
    if cfg["decode"]:
        return f"decode: blocks/SM {cfg['decode_blocks_per_sm']} stages {cfg['decode_stages'] or 'auto'}"
    return f"attention.cu: blocks/SM {cfg['blocks_per_sm']} stages {cfg['stages']}"


def bench_attention(sweep: bool) -> list[dict]:
    """Decode attention (batch 1, causal, page size 16) on the decode path (attention_decode.cu,
    "new") and on attention.cu ("old", the "decode" switch off), both with their default
    configuration and, with sweep, their sweeps. One query token, and one 8-token verify step.
    The cache rotates over enough copies that it does not sit in L2 (as the weights do in
    bench_gemv)."""
    results = []
    page_size = 16
    cases = [("llama3-8b", ctx, 1) for ctx in (272, 4096, 8192, 16384, 32768)]
    cases += [("llama3-8b", 8192, 8)]
    cases += [("llama3.2-1b", ctx, 1) for ctx in (8192, 32768)]
    for model, ctx, tokens in cases:
        heads, kv_heads, head_dim = ATTN_SHAPES[model]
        for kind in ("bf16", "int8"):
            pages = ctx // page_size + 1
            shape = (pages, page_size, kv_heads, head_dim)
            elem = 1 if kind == "int8" else 2
            kv_bytes = 2 * ctx * kv_heads * head_dim * elem
            caches = []
            for _ in range(_copies(kv_bytes)):
                if kind == "int8":
                    k = torch.randint(-127, 128, shape, dtype=torch.int8, device="cuda")
                    v = torch.randint(-127, 128, shape, dtype=torch.int8, device="cuda")
                    ks = torch.rand(shape[:3], device="cuda") * 0.01
                    vs = torch.rand(shape[:3], device="cuda") * 0.01
                else:
                    k = torch.randn(shape, device="cuda").to(torch.bfloat16)
                    v = torch.randn(shape, device="cuda").to(torch.bfloat16)
                    ks = vs = None
                caches.append((k, v, ks, vs))
            q = torch.randn(tokens, heads, head_dim, device="cuda").to(torch.bfloat16)
            out = torch.empty_like(q)
            cu = torch.tensor([0, tokens], dtype=torch.int32, device="cuda")
            lens = torch.tensor([ctx], dtype=torch.int32, device="cuda")
            table = torch.arange(pages, dtype=torch.int32, device="cuda")[None]
            max_ctx = pages * page_size
            ws = attn_ops.attention_workspace(tokens, heads, head_dim, max_ctx, "cuda")
            empty = torch.empty(0, dtype=torch.int32, device="cuda")
            step = AttentionStep(empty, empty.long(), cu, lens, table, tokens, max_ctx)
            layers = [LayerKV(*c) for c in caches]

            def call(i):
                attn_ops.attention(out, q, layers[i % len(layers)], step, head_dim ** -0.5, True, ws)

            default = tuning.attention_config()
            row = {"model": model, "kind": kind, "context": ctx, "tokens": tokens,
                   "kv_bytes": kv_bytes, "default": default, "configs": []}
            candidates = [None, {"decode": False}]
            if sweep:
                candidates += attention_decode_configs()
                if ctx >= 8192:
                    candidates += [{"decode": False, **c} for c in attention_configs()]
            for cfg in candidates:
                if cfg is not None and {**default, **cfg} == default:
                    continue
                settings = {**tuning.experiments["attention"], **(cfg or {})}
                with experiment(attention=settings):
                    t = time_graph(call, reps=max(10, len(caches)), replays=5)
                    config = tuning.attention_config()
                row["configs"].append({"config": config, "default": cfg is None,
                                       "seconds": t, "tb_per_s": kv_bytes / t / 1e12})
            old = [c for c in row["configs"] if not c["config"]["decode"]]
            old_default = next(c for c in old if c["config"] == {**default, "decode": False})
            best = min(row["configs"], key=lambda c: c["seconds"])
            row.update(default_seconds=row["configs"][0]["seconds"],
                       default_tb_per_s=row["configs"][0]["tb_per_s"],
                       old_seconds=old_default["seconds"], old_tb_per_s=old_default["tb_per_s"],
                       old_best_seconds=min(c["seconds"] for c in old),
                       new_best_seconds=min(c["seconds"] for c in row["configs"] if c["config"]["decode"]),
                       best=best["config"],
                       best_seconds=best["seconds"], best_tb_per_s=best["tb_per_s"])
            results.append(row)
            caches = layers = None  # free the copies before empty_cache
            torch.cuda.empty_cache()
    return results


def bench_sampling() -> list[dict]:
    from tileinfer.backend.sampling import SamplingParams

    results = []
    vocab = 128256
    logits = torch.randn(1, vocab, device="cuda") * 4
    out = torch.empty(1, dtype=torch.int32, device="cuda")
    seed = torch.tensor([1], device="cuda")
    counter = torch.tensor([0], device="cuda")
    for p in (SamplingParams(0.0), SamplingParams(0.8), SamplingParams(0.7, top_k=50),
              SamplingParams(0.8, top_p=0.9), SamplingParams(0.8, top_k=50, top_p=0.9)):
        t = time_graph(lambda i: sampling.sample_tokens(out, logits, p.temperature, p.top_k,
                                                        p.top_p, seed, counter, None), reps=10)
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
        t = time_graph(lambda i: linear.gemm(out, x, weight, s), reps=10)
        results.append({"kernel": label, "seconds": t, "tflop_per_s": flops / t / 1e12})
    out = torch.empty(m, rows, dtype=torch.bfloat16, device="cuda")
    t = time_graph(lambda i: torch.matmul(x, w.t(), out=out), reps=10)
    results.append({"kernel": "cuBLAS bf16", "seconds": t, "tflop_per_s": flops / t / 1e12})
    return results


def bench_layers(model: str, int8: bool) -> dict:
    """The decode chain of a layer without attention, as the model launches it: add_rmsnorm ->
    qkv GEMV -> o GEMV -> add_rmsnorm -> gate_up GEMV + SwiGLU -> down GEMV, over the model's
    layers (weights rotate out of L2), with and without programmatic dependent launch.
    Compare with the sum of the separately timed GEMVs to see what the kernel boundaries cost."""
    shapes = MODELS[model]
    hidden = shapes["o"][0]
    inter = shapes["down"][1]
    layer_bytes = sum(r * c for name, (r, c) in shapes.items() if name != "lm_head") * (1 if int8 else 2)
    layers = [{name: _weights(r, c, int8, 1)[0] for name, (r, c) in shapes.items() if name != "lm_head"}
              for _ in range(max(2, math.ceil(4 * L2_BYTES / layer_bytes)))]
    norm_w = torch.ones(hidden, dtype=torch.bfloat16, device="cuda")
    bf = dict(dtype=torch.bfloat16, device="cuda")
    residual = torch.randn(1, hidden, **bf)
    normed, delta = torch.randn(1, hidden, **bf), torch.randn(1, hidden, **bf) * 0.01
    qkv = torch.empty(1, shapes["qkv"][0], **bf)
    act, gate_up = torch.empty(1, inter, **bf), torch.empty(1, 2 * inter, **bf)

    def layer(i):
        w = layers[i % len(layers)]
        norm.add_rmsnorm(residual, normed, delta, norm_w, 1e-5)
        linear.linear(qkv, normed, *w["qkv"])
        linear.linear(delta, qkv[:, :hidden], *w["o"])  # stands in for the attention output
        norm.add_rmsnorm(residual, normed, delta, norm_w, 1e-5)
        linear.linear_swiglu(act, normed, *w["gate_up"], gate_up)
        linear.linear(delta, act, *w["down"])

    row = {"model": model, "int8": int8, "layer_weight_bytes": layer_bytes}
    for pdl in (False, True):
        try:
            with experiment(pdl=pdl):
                t = time_graph(layer, reps=LAYERS[model], replays=5)
        except Exception as exc:  # e.g. a driver without PDL in graphs: report, go on
            row["pdl" if pdl else "plain"] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        row["pdl" if pdl else "plain"] = {"seconds_per_layer": t, "tb_per_s": layer_bytes / t / 1e12}
    layers = None  # free the weights before empty_cache
    torch.cuda.empty_cache()
    return row


def _precompile_all(sweep: bool):
    """Every kernel variant the run will launch, compiled in parallel up front."""
    jobs = []
    device = torch.cuda.current_device()
    pdl = tuning.pdl(device)  # the sweeps launch as the model does
    for int8 in (False, True):
        for name in ("qkv", "gate_up"):
            epilogue, out_name = _shape_kind(name)
            for cfg in gemv_configs() if sweep else []:
                jobs.append(("gemv.cu", linear.gemv_defines(cfg, int8, 16, epilogue, out_name, pdl)))
    for shapes in MODELS.values():  # the default configurations, plain and with PDL
        for name, (rows, cols) in shapes.items():
            epilogue, out_name = _shape_kind(name)
            o_rows = rows // 2 if epilogue == "swiglu" else rows
            for int8 in (False, True):
                cfg = mma_config(o_rows, cols, int8, epilogue, device)
                for with_pdl in (False, True):
                    jobs.append(("gemv.cu", linear.gemv_defines(cfg, int8, 16, epilogue, out_name,
                                                                with_pdl)))
                cfg = tuning.gemv_config(o_rows, cols, int8, epilogue, device, kernel="rows")
                for with_pdl in (False, True):
                    jobs.append(("gemv_rows.cu", linear.gemv_rows_defines(
                        cfg, int8, epilogue, out_name, tuning.gemv_rows_tokens(1), with_pdl)))
                for cfg in gemv_rows_configs(o_rows, cols, int8, epilogue, device) if sweep else []:
                    jobs.append(("gemv_rows.cu", linear.gemv_rows_defines(
                        cfg, int8, epilogue, out_name, tuning.gemv_rows_tokens(1), pdl)))
    trigger = attn_ops._PDL_TRIGGERS[tuning.attention_config()["decode_pdl_trigger"]]
    for head_dim in (64, 128):
        for int8 in (0, 1):
            for stages in (2, 3):
                jobs.append(("attention.cu", {"HEAD_DIM": head_dim, "KV_INT8": int8, "SMOOTH": 0,
                                              "KV_STAGES": stages}))
            m_tiles = attn_ops.attention_decode_m_tiles(head_dim, 4)  # the benchmark's group
            stages = {attn_ops.attention_decode_stages(head_dim, bool(int8), False, m_tiles, b,
                                                       device)
                      for b in (1, 2, 3, 4)} | {2, 3, 4}  # attention_decode_configs()
            for depth in sorted(stages):
                defines = {"HEAD_DIM": head_dim, "KV_INT8": int8, "SMOOTH": 0, "KV_STAGES": depth,
                           "M_TILES": m_tiles}
                jobs.append(("attention_decode.cu", {**defines, "PDL_TRIGGER": trigger}
                             if trigger else defines))
    unique = {}
    for file, defines in jobs:
        unique.setdefault((file, tuple(sorted(defines.items()))), (file, defines))
    precompile(list(unique.values()))


SMEM_PER_BLOCK = 227 * 1024  # sm_90: the most dynamic shared memory one block may have


def _check_rows_config(cfg, o_rows, k_dim, int8, epilogue):
    """A launchable gemv_rows.cu configuration: legal defines, no idle warps, a split-K that fits
    the backend's scratch."""
    assert cfg["rows"] in (1, 2, 4, 8) and 1 <= cfg["unroll"] <= 4 and cfg["warps"] in (1, 2, 4, 8), cfg
    splits, _ = tuning.gemv_rows_split(cfg, k_dim, int8)
    assert cfg["warps"] * splits <= -(-k_dim // (32 * tuning.rows_lane_k(int8))), cfg
    assert splits == 1 or common.GemvScratch.fits(splits, 2 if epilogue == "swiglu" else 1, o_rows), cfg


def check_configs(device: int) -> int:
    """The sweeps' sanity checks: every mma configuration the sweep may time fits in a block's
    shared memory beside gemv.cu's static buffer, and so does every MMA_GEMV_TABLE entry; the
    rows sweep at each model shape holds 6..14 distinct launchable configurations, the shipped
    one among them. Returns how many configurations were checked."""
    checked = 0
    for shapes in MODELS.values():
        for name, (rows, cols) in shapes.items():
            epilogue, _ = _shape_kind(name)
            o_rows = rows // 2 if epilogue == "swiglu" else rows
            for int8 in (False, True):
                mma = [c for c in gemv_configs()
                       if linear.gemv_ring_bytes(c, cols, int8, epilogue) <= GEMV_RING_LIMIT]
                mma.append(mma_config(o_rows, cols, int8, epilogue, device))
                for cfg in mma:
                    ring = linear.gemv_ring_bytes(cfg, cols, int8, epilogue)
                    static = cfg["warps"] * 2 * 16 * 9 * 4  # gemv.cu's partial[][][][] buffer
                    assert ring <= GEMV_RING_LIMIT and ring + static <= SMEM_PER_BLOCK, cfg
                configs = gemv_rows_configs(o_rows, cols, int8, epilogue, device)
                keys = [(c["rows"], c["unroll"], c["warps"], c["split_k"]) for c in configs]
                assert 6 <= len(configs) <= 14 and len(set(keys)) == len(keys), configs
                shipped = tuning.gemv_config(o_rows, cols, int8, epilogue, device, kernel="rows")
                assert {k: shipped[k] for k in ("rows", "unroll", "warps", "split_k")} in configs
                for cfg in configs:
                    _check_rows_config(cfg, o_rows, cols, int8, epilogue)
                checked += len(mma) + len(configs)
    return checked


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--no-sweep", action="store_true", help="default configurations only")
    parser.add_argument("--sections", default="copy,gemv,attention,layers,sampling,gemm")
    parser.add_argument("--table", metavar="JSON", help="print the table of a saved run and exit")
    parser.add_argument("--check", action="store_true",
                        help="check the sweeps' configurations (an H200-sized device without a "
                             "GPU) and exit")
    args = parser.parse_args(argv)
    if args.table:
        with open(args.table) as f:
            print_table(json.load(f))
        return 0
    if args.check:
        if not torch.cuda.is_available():  # device 0 as an H200 (132 SMs)
            common._device_properties[(0, "multi_processor_count")] = 132
        device = torch.cuda.current_device() if torch.cuda.is_available() else 0
        print(f"checked {check_configs(device)} configurations")
        return 0
    sections = args.sections.split(",")
    sweep = not args.no_sweep
    t0 = time.time()
    check_configs(torch.cuda.current_device())
    common.reserve_scratch("cuda")  # as a model runner does before it captures graphs
    report = {"device": torch.cuda.get_device_name(), "nvrtc": compiler.nvrtc_version(),
              "torch": torch.__version__}
    _precompile_all(sweep)
    report["compile_seconds"] = time.time() - t0

    def save():  # after every section, so that a run cut short still leaves its results
        report["wall_seconds"] = time.time() - t0
        if args.out:  # everything, every configuration of the sweeps included
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)

    if "copy" in sections:
        report["copy"] = bench_copy()
    if "gemv" in sections:
        report["gemv"] = []
        for model in MODELS:
            for int8 in (False, True):
                report["gemv"] += bench_gemv(model, int8, sweep)
                save()
        report["gemv_per_token"] = [
            {"model": m, "int8": q, "kernel": "rows",
             **{f"{which}_seconds": per_token(report["gemv"], m, q, which)
                for which in ("default", "best", "best_mma", "best_rows")}}
            for m in MODELS for q in (False, True)]
        report["gemv_table"] = gemv_table(report["gemv"], "mma")
        report["gemv_rows_table"] = gemv_table(report["gemv"], "rows")
        save()
    if "attention" in sections:
        report["attention"] = bench_attention(sweep)
        save()
    if "layers" in sections:
        report["layers"] = [bench_layers(m, q) for m in MODELS for q in (False, True)]
        save()
    if "sampling" in sections:
        report["sampling"] = bench_sampling()
    if "gemm" in sections:
        report["gemm"] = bench_gemm()
    report["fallbacks"] = dict(common.fallback_counts)
    save()
    # stdout: the JSON without the sweeps' per-configuration rows, then the table
    summary = {k: ([{f: v for f, v in row.items() if f != "configs"} for row in val]
                   if k in ("gemv", "attention") else val) for k, val in report.items()}
    print(json.dumps(summary, separators=(",", ":")))
    print_table(report)
    return 0


def _config_name(cfg: dict) -> str:
    """A GEMV configuration in a few characters: mma "w4 s4 L2", rows "r4 u2 w2 k1"."""
    if cfg.get("kernel", "mma") == "rows":
        return f"r{cfg['rows']} u{cfg['unroll']} w{cfg['warps']} k{cfg['split_k']}"
    return f"w{cfg['warps']} s{cfg['stages']}" + (" L2" if cfg.get("l2_256b") else "")


def print_table(report: dict):
    """The short table: fractions of the measured copy bandwidth (read + write)."""
    copy_bw = report.get("copy", {}).get("tb_per_s") or float("nan")
    print(f"\ncopy {copy_bw:.2f} TB/s; compile {report.get('compile_seconds', 0):.0f} s, "
          f"total {report['wall_seconds']:.0f} s")
    if report.get("gemv"):
        print(f"{'gemv (1 token)':27s}{'default':22s}{'best mma':33s}{'best rows':33s}cuBLAS")
    for row in report.get("gemv", []):
        cub = row.get("cublas", {}).get("tb_per_s")
        if "best_mma" not in row and "best_rows" not in row:  # a run from before the rows kernel
            row = {**row, "best_mma": row["best"], "best_mma_seconds": row["best_seconds"],
                   "best_mma_tb_per_s": row["best_tb_per_s"]}

        def cell(kernel):
            cfg = row.get(f"best_{kernel}")
            if cfg is None:
                return " " * 31
            return (f"{row[f'best_{kernel}_seconds'] * 1e6:7.1f} us "
                    f"{row[f'best_{kernel}_tb_per_s'] / copy_bw:4.0%} {_config_name(cfg):14s}")

        print(f"  {row['model']:11s} {row['shape']:7s} {'int8' if row['int8'] else 'bf16'} "
              f"{row['default_seconds'] * 1e6:7.1f} us {row['default_tb_per_s'] / copy_bw:4.0%} "
              f"{row['default'].get('kernel', 'mma'):4s}  {cell('mma')}  {cell('rows')}  "
              + (f"{cub / copy_bw:4.0%}" if cub else ""))
    for row in report.get("gemv_per_token", []):
        line = ", ".join(f"{which.replace('_', ' ')} {row[f'{which}_seconds'] * 1e3:.3f} ms"
                         for which in ("default", "best", "best_mma", "best_rows")
                         if f"{which}_seconds" in row)
        print(f"  per token {row['model']:11s} {'int8' if row['int8'] else 'bf16'}: {line}")
    for name, key in (("MMA_GEMV_TABLE", "gemv_table"), ("GEMV_ROWS_TABLE", "gemv_rows_table")):
        if report.get(key):
            print(f"  {name} = {{")
            for k, cfg in report[key].items():
                print(f"      {k}: {cfg},")
            print("  }")
    for row in report.get("layers", []):
        plain, pdl = row["plain"], row["pdl"]
        if "error" in plain or "error" in pdl:
            print(f"layer chain {row['model']} {'int8' if row['int8'] else 'bf16'}: {plain} {pdl}")
            continue
        print(f"layer chain {row['model']:11s} {'int8' if row['int8'] else 'bf16'}: "
              f"{plain['seconds_per_layer'] * 1e6:6.1f} us/layer ({plain['tb_per_s'] / copy_bw:4.0%}), "
              f"with PDL {pdl['seconds_per_layer'] * 1e6:6.1f} us ({pdl['tb_per_s'] / copy_bw:4.0%})")
    if report.get("attention"):
        print("attention (batch 1)               new (decode)     old (attention.cu)  best"
              "             best config")
    by_key = {}
    for row in report.get("attention", []):
        tokens = row.get("tokens", 1)
        by_key[(row["model"], row["context"], tokens, row["kind"])] = row
        old = (f"{row['old_seconds'] * 1e6:7.1f} us {row['old_tb_per_s'] / copy_bw:4.0%}"
               if "old_seconds" in row else " " * 15)
        print(f"  {row['model']:11s} {row['kind']} ctx {row['context']:6d} q{tokens} "
              f"{row['default_seconds'] * 1e6:7.1f} us {row['default_tb_per_s'] / copy_bw:4.0%}  "
              f"{old}     {row['best_seconds'] * 1e6:7.1f} us {row['best_tb_per_s'] / copy_bw:4.0%}  "
              f"{_attention_config_name({'decode': False, **row['best']})}")
    for (model, ctx, tokens, kind), row in by_key.items():
        if "old_seconds" in row:
            print(f"  new over old {model} {kind} ctx {ctx} q{tokens}: default "
                  f"{row['old_seconds'] / row['default_seconds']:.2f}x, best of each "
                  f"{row['old_best_seconds'] / row['new_best_seconds']:.2f}x")
    for (model, ctx, tokens, kind), row in by_key.items():
        bf = by_key.get((model, ctx, tokens, "bf16"))
        if kind == "int8" and bf:
            old = (f", old {bf['old_seconds'] / row['old_seconds']:.2f}x" if "old_seconds" in row else "")
            print(f"  int8 speedup over bf16 {model} ctx {ctx} q{tokens}: default "
                  f"{bf['default_seconds'] / row['default_seconds']:.2f}x, best "
                  f"{bf['best_seconds'] / row['best_seconds']:.2f}x{old}")
    for row in report.get("sampling", []):
        print(f"sampling {row['params']}: {row['seconds'] * 1e6:.1f} us")
    for row in report.get("gemm", []):
        print(f"gemm {row['kernel']}: {row['tflop_per_s']:.0f} TFLOP/s")


if __name__ == "__main__":
    sys.exit(main())
