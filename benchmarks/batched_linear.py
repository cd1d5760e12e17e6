"""The matrix products of one decode step at n rows: what a batched step costs in its linears.

For a random-weight model of a named shape, times every linear of one step (per layer: qkv, o,
the SwiGLU input, down; then the float32 lm_head) at n = 1, 2, 4, ... rows, captured back to back
in one CUDA graph (``timing.time_graph``): the model's own weights, so nothing is served from L2.
Reported per n: the linears' milliseconds per step and the weight bytes over that time (GB/s),
per variant:

- ``<backend>``: the backend's ``linear`` ops as the batched engine calls them
  (``batch_invariant=False``: any kernel for n rows);
- ``<backend>-invariant``: as a single sequence's steps call them (``batch_invariant=True``:
  up to 8 rows each row computed as in a 1-row step, what speculative verification needs);
- ``<backend>-batch-invariant`` (``--batch-invariant``): in the batch-invariant mode
  (``Invariance.BATCH``, what ``--deterministic`` runs; n of 1,024: a prefill's linears);
- ``cublas``: torch.matmul (cuBLAS) for every product, the SwiGLU in torch (bf16 weights only).

    python benchmarks/batched_linear.py --shape llama3-8b --backends cuda,triton
    python benchmarks/batched_linear.py --shape llama3-8b --int8 --rows 1,8,64

``--mma-sweep N``: instead, gemv.cu (the CUDA backend's batched GEMV: 8 token slots, or 16, 32
or 64 as several token tiles) at N rows under every configuration of ``mma_configs`` that fits
in shared memory, each matrix of the step timed on its own (all layers' copies back to back);
one JSON row per matrix with its best configuration and its time against the shipped path's
(``shipped``: whatever the backend runs at N rows, cuBLAS for bf16 weights above 8 rows unless
``WIDE_MAX_TOKENS`` says otherwise), then the ``MMA_GEMV_TABLE`` (N <= 8) or
``MMA_GEMV_WIDE_TABLE`` entries.

    python benchmarks/batched_linear.py --shape llama3-8b --mma-sweep 8

With ``--fp8`` the sweep times gemv.cu's FP8 build (the input's quantization included) with the
warps swept too, and prints ``FP8_GEMV_TABLE`` entries (the LM head stays bf16 and is left out).

    python benchmarks/batched_linear.py --shape llama3-8b --fp8 --mma-sweep 1

``--gemm-sweep N``: gemm_invariant.cu (the CUDA backend's batch-invariant steps of many rows) at
N rows under row warps x stages x steps a stage x split x the parts' layout (``--gemm-layouts``:
``interleaved``, ``chunkG`` (interleaved in chunks of G steps), ``blocked``), per matrix: the
batched path's time (cuBLAS), the shipped invariant path's and the best, the best of each
layout beside gemv.cu's 1-row step in that layout (the order a layout gives both kernels: what
it costs a single sequence), then ``INVARIANT_GEMM_TABLE`` entries (and, with ``--int8``,
``BATCHED_GEMM_TABLE`` entries: where a setting in any layout beat the default path).

    python benchmarks/batched_linear.py --shape llama3-8b --gemm-sweep 64

``--mma-sweep N --invariant``: gemv.cu's batch-invariant builds (``Invariance.BATCH``) at N rows,
the weight's warps fixed, row groups, stages, tiles and the register stream swept; per matrix the
batched path's time (cuBLAS), the shipped invariant build's and the best, then
``INVARIANT_GEMV_TABLE`` entries.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch
import torch.nn.functional as F
from timing import time_graph

from tileinfer.backend import get_backend
from tileinfer.backend.hookspecs import Invariance
from tileinfer.engine.memory import linear_weight_bytes
from tileinfer.model.quant import linear_operands
from tileinfer.model.random_weights import random_model, shape_config


def step_calls(model, ops, n: int, invariant):
    """Zero-argument callables running one step's linears at n rows with ``ops`` (None: cuBLAS),
    ``invariant`` their batch_invariant (False, True or Invariance.BATCH)."""
    c, dev, dt = model.config, model.device, model.dtype
    x = torch.randn(n, max(c.hidden_size, c.q_size, c.intermediate_size), device=dev).to(dt)
    qkv = torch.empty(n, c.qkv_size, device=dev, dtype=dt)
    delta = torch.empty(n, c.hidden_size, device=dev, dtype=dt)
    act = torch.empty(n, c.intermediate_size, device=dev, dtype=dt)
    gate_up = torch.empty(n, 2 * c.intermediate_size, device=dev, dtype=dt)
    logits = torch.empty(n, c.vocab_size, device=dev, dtype=torch.float32)
    h, a, m = x[:, :c.hidden_size], x[:, :c.q_size], x[:, :c.intermediate_size]
    calls = []
    for layer in model.weights.layers:
        if ops is None:
            calls += [lambda w=layer.qkv: torch.matmul(h, w.t(), out=qkv),
                      lambda w=layer.o: torch.matmul(a, w.t(), out=delta),
                      lambda w=layer.up: act.copy_(_swiglu_torch(h, w, gate_up)),
                      lambda w=layer.down: torch.matmul(m, w.t(), out=delta)]
            continue
        kw = dict(batch_invariant=invariant)
        calls += [lambda w=layer.qkv: ops.linear(qkv, h, *linear_operands(w), **kw),
                  lambda w=layer.o: ops.linear(delta, a, *linear_operands(w), **kw),
                  lambda w=layer.up: ops.linear_swiglu(act, h, *linear_operands(w), gate_up, **kw),
                  lambda w=layer.down: ops.linear(delta, m, *linear_operands(w), **kw)]
    head = model.weights.lm_head
    if ops is None:
        calls.append(lambda: logits.copy_(torch.matmul(h, head.t())))
    else:
        calls.append(lambda: ops.linear(logits, h, *linear_operands(head),
                                        batch_invariant=invariant))
    return calls


def matrix_calls(model, ops, n: int, invariant=False) -> dict:
    """Per matrix of the step (qkv, o, gate_up, down, lm_head): callables running that product
    for every layer at n rows, as the batched engine calls them (``invariant``: the linear ops'
    batch_invariant)."""
    calls = step_calls(model, ops, n, invariant)
    layers = model.config.num_layers
    names = ["qkv", "o", "gate_up", "down"]
    found = {name: calls[i:4 * layers:4] for i, name in enumerate(names)}
    found["lm_head"] = calls[-1:]
    return found


def matrix_key(model, name: str) -> tuple:
    """The tuning table's key of a matrix: (output rows, K, int8, epilogue)."""
    c, int8 = model.config, model.quantize in ("int8", "fp8")  # FP8: INT8's byte layout
    return {"qkv": (c.qkv_size, c.hidden_size, int8, "none"),
            "o": (c.hidden_size, c.q_size, int8, "none"),
            "gate_up": (c.intermediate_size, c.hidden_size, int8, "swiglu"),
            "down": (c.hidden_size, c.intermediate_size, int8, "none"),
            "lm_head": (c.vocab_size, c.hidden_size, model.quantize == "int8", "none")}[name]


# Shared memory a gemv.cu block may take (dynamic; the kernel has no static buffer).
SMEM_LIMIT = 227 * 1024


# --mma-sweep's warps, ring stages and row groups (--mma-warps, --mma-stages, --mma-groups)
MMA_SWEEP = {"warps": (4, 8, 16), "stages": (2, 3, 4, 6), "groups": (1,)}


def mma_configs(key, token_tiles: int, fp8: bool = False) -> list[dict]:
    """gemv.cu's sweep at one matrix: warps splitting K x ring stages x 16-row tiles a warp x the
    L2 prefetch hint (x row groups a block), those that fit in shared memory (with several token
    tiles and weight tiles, also with x read once for a warp's tiles: X_REUSE); and the register
    stream (REGS steps a round instead of the ring) x warps x tiles."""
    from tileinfer_backend_cuda.ops import linear

    _, k_dim, int8, epilogue = key
    configs = []
    for warps in MMA_SWEEP["warps"]:
        for stages, groups in itertools.product(MMA_SWEEP["stages"], MMA_SWEEP["groups"]):
            for tiles in (1, 2, 4):
                grouped = {"groups": groups} if groups > 1 else {}
                candidates = [{"warps": warps, "stages": stages, "tiles": tiles, "l2_256b": l2,
                               **grouped} for l2 in (False, True)]
                if token_tiles > 1 and (tiles > 1 or epilogue == "swiglu"):
                    candidates.append({"warps": warps, "stages": stages, "tiles": tiles,
                                       "l2_256b": True, "xreuse": True})
                for cfg in candidates:
                    smem = linear.gemv_smem_bytes(cfg, k_dim, int8, epilogue, token_tiles, fp8)
                    if smem <= SMEM_LIMIT:
                        configs.append(cfg)
        if linear.gemv_regs({"regs": 1}, int8, linear.int8_load(k_dim)):
            for regs in (2, 4):
                for tiles in (1, 2):
                    configs.append({"warps": warps, "stages": 2, "tiles": tiles, "regs": regs})
    return configs


def time_configs(calls, configs, settings_of) -> list[tuple[float, dict | None]]:
    """(seconds of the calls, configuration) under the shipped path (None, first) and under each
    configuration's experiments, ``settings_of(cfg)``; each run once before it is timed. Every
    variant's kernel builds are compiled first, in parallel (a dry pass: recorded_builds)."""
    from cuda_kernels import precompile, recorded_builds
    from tileinfer_backend_cuda.ops import tuning

    variants = [{} if cfg is None else settings_of(cfg) for cfg in [None] + configs]
    with recorded_builds([]) as jobs:
        for settings in variants:
            with tuning.experiment(settings):
                for call in calls:
                    call()
    precompile(jobs)
    timed = []
    for cfg in [None] + configs:
        with tuning.experiment({} if cfg is None else settings_of(cfg)):
            for call in calls:
                call()
            timed.append((time_graph(calls, replays=5) * len(calls), cfg))
    return timed


def mma_sweep(model, n: int):
    from tileinfer_backend_cuda.ops import tuning

    ops = get_backend("cuda")
    fp8 = model.quantize == "fp8"
    names = ["qkv", "o", "gate_up", "down"] + ([] if fp8 else ["lm_head"])
    token_tiles = tuning.mma_token_tiles(n)
    wide = {"bf16": 64, "int8": 64}  # every candidate runs gemv.cu
    table = {}
    for name, calls in matrix_calls(model, ops, n).items():
        if name not in names:
            continue
        key = matrix_key(model, name)
        timed = time_configs(calls, mma_configs(key, token_tiles, fp8),
                             lambda cfg: {"gemv": {"kernel": "mma", **cfg}, "gemv_wide": wide})
        shipped = timed[0][0]
        best_s, best = min(timed[1:], key=lambda t: t[0])
        if shipped <= best_s:
            best_s, best = shipped, None
        row = dict(matrix=name, key=list(key), rows=n, shipped_ms=round(shipped * 1e3, 4),
                   best_ms=round(best_s * 1e3, 4), best=best, configs=len(timed) - 1)
        for warps in MMA_SWEEP["warps"]:  # the best at each count of warps splitting K
            of = [t for t in timed[1:] if t[1]["warps"] == warps]
            if of:
                s, cfg = min(of, key=lambda t: t[0])
                row[f"best_warps{warps}"] = [round(s * 1e3, 4), cfg]
        print(json.dumps(row), flush=True)
        if best is not None and fp8:
            table[key[0], key[1], key[3]] = best
        elif best is not None:
            table[key if token_tiles == 1 else key + (token_tiles,)] = best
    which = ("FP8_GEMV_TABLE" if fp8 else "MMA_GEMV_TABLE" if token_tiles == 1
             else "MMA_GEMV_WIDE_TABLE")
    print(f"{which} entries (the shipped path was best for the others):", file=sys.stderr)
    for key, cfg in table.items():
        print(f"    {key}: {cfg},", file=sys.stderr)


def timed_invariant_matrices(model, n: int, sweeps: dict, settings_of):
    """Per matrix at n rows: (name, key, the batched path's seconds, [(seconds, cfg)]) with the
    shipped batch-invariant path first (cfg None), then each of ``sweeps[name]`` under its
    experiments ``settings_of(cfg)``."""
    ops = get_backend("cuda")
    batched = matrix_calls(model, ops, n)
    for name, calls in matrix_calls(model, ops, n, Invariance.BATCH).items():
        if name not in sweeps:
            continue
        base = time_configs(batched[name], [], None)[0][0]
        yield name, matrix_key(model, name), base, time_configs(calls, sweeps[name], settings_of)


def invariant_configs(key, token_tiles: int, warps: int) -> list[dict]:
    """gemv.cu's batch-invariant builds at one matrix: the weight's warps (fixed: they order the
    sums) x row groups x (ring stages x 16-row tiles, with and without x reuse, or the register
    stream's steps a round x tiles), those that fit in a block. At one token tile the rings go
    deeper too (8 and 12 stages: a weight summed in few parts streams each row with few warps)."""
    from tileinfer_backend_cuda.ops import linear

    _, k_dim, int8, epilogue = key
    configs = []
    for groups in (1, 2, 4):
        if groups * warps > 32:
            continue
        for stages in (2, 3, 4) + ((8, 12) if token_tiles == 1 else ()):
            for tiles in (1, 2, 4):
                configs.append({"warps": warps, "groups": groups, "stages": stages,
                                "tiles": tiles, "l2_256b": True})
                if tiles > 1 or epilogue == "swiglu":  # x read once for a warp's tiles
                    configs.append({"warps": warps, "groups": groups, "stages": stages,
                                    "tiles": tiles, "l2_256b": True, "xreuse": True})
        if linear.gemv_regs({"regs": 1}, int8, linear.int8_load(k_dim)):
            for regs in (1, 2, 4):
                for tiles in (1, 2, 4):
                    configs.append({"warps": warps, "groups": groups, "stages": 2,
                                    "tiles": tiles, "regs": regs})
    return [c for c in configs
            if linear.gemv_smem_bytes(c, k_dim, int8, epilogue, token_tiles) <= SMEM_LIMIT]


def invariant_sweep(model, n: int):
    """--mma-sweep N --invariant: gemv.cu's batch-invariant builds at N rows per matrix, against
    the batched path (cuBLAS above wide_max_tokens rows) and the shipped invariant build; prints
    INVARIANT_GEMV_TABLE entries."""
    from tileinfer_backend_cuda.ops import invariant_tuning, tuning

    device = torch.cuda.current_device()
    token_tiles = tuning.mma_token_tiles(n)
    names = ["qkv", "o", "gate_up", "down", "lm_head"]
    sweeps = {}
    for name in names:
        _, k_dim, int8, epilogue = key = matrix_key(model, name)
        warps = (invariant_tuning.invariant_order(*key).get("parts")  # the order's parts
                 or tuning.gemv_config(key[0], k_dim, int8, epilogue, device, kernel="mma")["warps"])
        sweeps[name] = invariant_configs(key, token_tiles, warps)
    table, totals = {}, {"batched": 0.0, "invariant": 0.0, "best": 0.0}
    for name, key, base, timed in timed_invariant_matrices(
            model, n, sweeps, lambda cfg: {"gemv": {"kernel": "mma", **cfg}}):
        shipped = timed[0][0]
        best_s, best = min(timed[1:], key=lambda t: t[0]) if len(timed) > 1 else (shipped, None)
        if shipped <= best_s:
            best_s, best = shipped, None
        for label, seconds in (("batched", base), ("invariant", shipped), ("best", best_s)):
            totals[label] += seconds
        row = dict(matrix=name, key=list(key), rows=n, batched_ms=round(base * 1e3, 4),
                   invariant_ms=round(shipped * 1e3, 4), best_ms=round(best_s * 1e3, 4),
                   best=best, configs=len(timed) - 1)
        print(json.dumps(row), flush=True)
        if best is not None:
            table[key + (token_tiles,)] = {k: v for k, v in best.items() if k != "warps"}
    print(json.dumps({"rows": n, **{f"{k}_ms": round(v * 1e3, 4) for k, v in totals.items()}}),
          flush=True)
    print("INVARIANT_GEMV_TABLE entries (the shipped build was best for the others):",
          file=sys.stderr)
    for key, cfg in table.items():
        print(f"    {key}: {cfg},", file=sys.stderr)


LAYOUTS = {"interleaved": {"blocked": False, "chunk": 1}, "blocked": {"blocked": True}}


def parts_layout(name: str) -> dict:
    """A --gemm-layouts name as the "invariant_gemm" settings that give it ("-nk": products of
    neighbouring k, gemv_nk.cuh)."""
    base = name.removesuffix("-nk")
    if base.startswith("chunk"):
        layout = {"blocked": False, "chunk": int(base.removeprefix("chunk"))}
    else:
        layout = dict(LAYOUTS[base])
    return {**layout, "nk": True} if name.endswith("-nk") else layout


def layout_name(cfg: dict) -> str:
    """The parts' layout of a setting, and its runs where the setting names them."""
    if cfg.get("blocked"):
        name = "blocked"
    else:
        name = "interleaved" if cfg.get("chunk", 1) == 1 else f"chunk{cfg['chunk']}"
    name += ("-nk" if cfg.get("nk") else "") + ("-wgmma" if cfg.get("wgmma") else "")
    name += "-tma" if cfg.get("tma") else ""
    return f"{name}-runs{cfg['runs']}" if cfg.get("runs") else name


# --gemm-sweep's runs of the parts (None: the weight's own, invariant_runs), row warps and 16-row
# tiles a warp (--gemm-runs, --gemm-warps, --gemm-tiles)
GEMM_SWEEP = {"runs": (None,), "warps": (4, 8), "tiles": (1, 2), "splits": (True, False)}
SPLITS = {"split": True, "unsplit": False}  # --gemm-splits's names


def gemm_configs(key, n: int, stages_options=(4, 8), steps_options=(1, 2, 4),
                 layouts=("interleaved", "blocked")) -> list[dict]:
    """gemm_invariant.cu's launches at one matrix and n rows that fit in a block: row warps x row
    tiles (a single matrix: two tiles a warp spill the SwiGLU's registers) x stages x steps a
    stage x split (narrow weights: the runs in blocks of their own or not) x parts layout."""
    from tileinfer_backend_cuda.ops import gemm_invariant, linear, tuning

    o_rows, k_dim, int8, epilogue = key
    load = linear.int8_load(k_dim)
    tiles = tuning.mma_token_tiles(min(n, 64))
    parts = tuning.gemv_config(o_rows, k_dim, int8, epilogue, 0, kernel="mma")["warps"]
    row_tiles = (1,) if epilogue == "swiglu" else GEMM_SWEEP["tiles"]
    kernels = {k: True for k in ("wgmma", "tma") if GEMM_SWEEP.get(k)}  # --gemm-wgmma, --gemm-tma
    configs = []
    for runs in GEMM_SWEEP["runs"]:
        if runs and parts % runs:
            continue
        named = {"runs": runs} if runs else {}
        if not runs:
            runs = gemm_invariant.invariant_runs(o_rows, k_dim, int8, epilogue, parts)
        splits = GEMM_SWEEP["splits"] if runs > 1 else (False,)
        for row_warps, tiles_a_warp, stages, stage_steps, split, layout in itertools.product(
                GEMM_SWEEP["warps"], row_tiles, stages_options, steps_options, splits, layouts):
            cfg = {"row_warps": row_warps, "row_tiles": tiles_a_warp, "stages": stages,
                   "stage_steps": stage_steps, "split": split, **parts_layout(layout),
                   **named, "min_rows": 1, **kernels}
            if gemm_invariant.gemm_smem_bytes(cfg, int8, load, epilogue, tiles) <= SMEM_LIMIT:
                configs.append(cfg)
    return configs


def gemm_sweep(model, n: int, stages_options=(4, 8), steps_options=(1, 2, 4),
               layouts=("interleaved", "blocked"), parts: int | None = None):
    """--gemm-sweep N: gemm_invariant.cu's launches at N rows per matrix against the batched path
    and the shipped invariant path; prints INVARIANT_GEMM_TABLE entries. parts (--gemm-parts):
    every weight's K split into that many parts (gemv.cu's warps) instead of its 8-row build's,
    in gemv.cu's invariant steps as in the GEMM's."""
    from tileinfer_backend_cuda.ops import tuning

    forced = {"gemv": {"warps": parts}} if parts else {}
    with tuning.experiment(forced):
        _gemm_sweep(model, n, stages_options, steps_options, layouts, forced)


def _gemm_sweep(model, n, stages_options, steps_options, layouts, forced):
    from tileinfer_backend_cuda.ops import gemm_invariant

    names = GEMM_SWEEP.get("matrices") or ["qkv", "o", "gate_up", "down", "lm_head"]
    sweeps = {name: gemm_configs(matrix_key(model, name), n, stages_options, steps_options,
                                 layouts)
              for name in names}
    # gemv.cu's 1-row step in each layout and runs (min_rows past 64: no gemm_invariant.cu)
    orders = [{**parts_layout(lay), **({"runs": runs} if runs else {}), "min_rows": 65}
              for lay in layouts for runs in GEMM_SWEEP["runs"]]
    one_row = {name: {"shipped": timed[0][0], **{layout_name(c): t for t, c in timed[1:]}}
               for name, _, _, timed in
               timed_invariant_matrices(model, 1, {name: orders for name in names},
                                        lambda cfg: {"invariant_gemm": cfg, **forced})}
    table, orders, batched_table = {}, {}, {}
    totals = {"batched": 0.0, "invariant": 0.0, "best": 0.0}
    for name, key, base, timed in timed_invariant_matrices(
            model, n, sweeps, lambda cfg: {"invariant_gemm": cfg, **forced}):
        shipped = timed[0][0]
        best_s, best = min(timed[1:], key=lambda t: t[0]) if len(timed) > 1 else (shipped, None)
        for label, seconds in (("batched", base), ("invariant", shipped), ("best", best_s)):
            totals[label] += seconds
        top = sorted(timed[1:], key=lambda t: t[0])[:5]
        by_layout = {}  # the best of each parts layout (it is one setting for every weight)
        for t, c in timed[1:]:
            layout = layout_name(c)
            if layout not in by_layout or t < by_layout[layout][0]:
                by_layout[layout] = (t, c)
        row = dict(matrix=name, key=list(key), rows=n, batched_ms=round(base * 1e3, 4),
                   invariant_ms=round(shipped * 1e3, 4), best_ms=round(best_s * 1e3, 4),
                   best=best, configs=len(timed) - 1,
                   top=[[round(t * 1e3, 4), c] for t, c in top],
                   **{f"best_{k}": [round(t * 1e3, 4), c] for k, (t, c) in by_layout.items()},
                   **{f"gemv_1_row_{k}_ms": round(t * 1e3, 4) for k, t in one_row[name].items()})
        print(json.dumps(row), flush=True)
        if best is not None and best_s < shipped:  # launch settings; the order apart
            order_keys = gemm_invariant.ORDER_KEYS
            table[key] = {k: v for k, v in best.items() if k not in order_keys | {"min_rows"}}
            orders[key] = {k: v for k, v in best.items() if k in order_keys}
        if best is not None and best_s < base:  # faster than the default path (INT8: gemv.cu)
            batched_table[key] = {k: v for k, v in best.items() if k not in ("min_rows", "runs")}
    print(json.dumps({"rows": n, **{f"{k}_ms": round(v * 1e3, 4) for k, v in totals.items()}}),
          flush=True)
    print("INVARIANT_GEMM_TABLE entries, and the INVARIANT_ORDER they were timed in:",
          file=sys.stderr)
    for key, cfg in table.items():
        print(f"    {key}: {cfg},  # order {orders[key]}", file=sys.stderr)
    if batched_table:
        print("BATCHED_GEMM_TABLE entries (beat the default path, any parts layout):",
              file=sys.stderr)
        for key, cfg in batched_table.items():
            print(f"    {key}: {cfg},", file=sys.stderr)


def _swiglu_torch(h, w, gate_up):
    torch.matmul(h, w.t(), out=gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama3-8b")
    p.add_argument("--backends", default="cuda,triton")
    p.add_argument("--int8", action="store_true", help="INT8 weights")
    p.add_argument("--fp8", action="store_true", help="FP8 weights")
    p.add_argument("--rows", default="1,2,4,8,16,32,64,128")
    p.add_argument("--invariant", action="store_true",
                   help="also time batch_invariant=True (the single-sequence calls); with "
                        "--mma-sweep, sweep the batch-invariant builds")
    p.add_argument("--batch-invariant", action="store_true",
                   help="also time the batch-invariant mode (Invariance.BATCH)")
    p.add_argument("--cublas", action="store_true", help="also time torch.matmul (bf16)")
    p.add_argument("--mma-sweep", type=int, metavar="N",
                   help="sweep gemv.cu's configurations at N rows instead (see above)")
    p.add_argument("--gemm-sweep", type=int, metavar="N",
                   help="sweep gemm_invariant.cu's launches at N rows instead (see above)")
    p.add_argument("--gemm-stages", default="4,8", help="--gemm-sweep's ring stages")
    p.add_argument("--gemm-steps", default="1,2,4", help="--gemm-sweep's K steps a stage")
    p.add_argument("--gemm-layouts", default="interleaved,blocked",
                   help="--gemm-sweep's parts layouts: interleaved, chunkG (G a power of two), "
                        "blocked; each with -nk for products of neighbouring k")
    p.add_argument("--gemm-parts", type=int, help="--gemm-sweep with K in this many parts "
                   "(gemv.cu's warps) for every weight")
    p.add_argument("--gemm-runs", default="",
                   help="--gemm-sweep's runs of the parts (comma list; each weight's own if "
                        "empty): the order of the sums, in gemv.cu's 1-row step too")
    p.add_argument("--gemm-warps", default="4,8", help="--gemm-sweep's row warps a block")
    p.add_argument("--gemm-tiles", default="1,2", help="--gemm-sweep's 16-row tiles a warp")
    p.add_argument("--gemm-splits", default="split,unsplit",
                   help="--gemm-sweep's launches of runs > 1: split (a block a run, a cluster a "
                        "row tile), unsplit (a block all runs)")
    p.add_argument("--gemm-matrices", default="", help="--gemm-sweep's matrices (all if empty)")
    p.add_argument("--gemm-wgmma", action="store_true", help="--gemm-sweep's launches with the "
                   "wgmma setting (gemm_wgmma.cu where it keeps the order: -nk layouts, bf16)")
    p.add_argument("--gemm-tma", action="store_true", help="with --gemm-wgmma: its weights "
                   "by TMA (the tma setting)")
    p.add_argument("--mma-warps", default="4,8,16", help="--mma-sweep's warps splitting K")
    p.add_argument("--mma-stages", default="2,3,4,6", help="--mma-sweep's ring stages")
    p.add_argument("--mma-groups", default="1", help="--mma-sweep's row groups a block")
    args = p.parse_args()
    for name in ("warps", "stages", "groups"):
        MMA_SWEEP[name] = tuple(int(v) for v in getattr(args, f"mma_{name}").split(","))
    GEMM_SWEEP.update(runs=tuple(int(v) for v in args.gemm_runs.split(",")) if args.gemm_runs
                      else (None,),
                      warps=tuple(int(v) for v in args.gemm_warps.split(",")),
                      tiles=tuple(int(v) for v in args.gemm_tiles.split(",")),
                      matrices=[m for m in args.gemm_matrices.split(",") if m],
                      splits=tuple(SPLITS[v] for v in args.gemm_splits.split(",")),
                      wgmma=args.gemm_wgmma, tma=args.gemm_tma)
    rows = [int(r) for r in args.rows.split(",")]
    quantize = "int8" if args.int8 else "fp8" if args.fp8 else None
    model = random_model(shape_config(args.shape), backend="ref", quantize=quantize, max_len=256)
    if args.gemm_sweep:
        return gemm_sweep(model, args.gemm_sweep,
                          [int(v) for v in args.gemm_stages.split(",")],
                          [int(v) for v in args.gemm_steps.split(",")],
                          args.gemm_layouts.split(","), args.gemm_parts)
    if args.mma_sweep:
        if args.invariant:
            return invariant_sweep(model, args.mma_sweep)
        return mma_sweep(model, args.mma_sweep)
    nbytes = linear_weight_bytes(model)
    variants = []
    for name in args.backends.split(","):
        ops = get_backend(name)
        variants.append((name, ops, False))
        if args.invariant:
            variants.append((f"{name}-invariant", ops, True))
        if args.batch_invariant:
            variants.append((f"{name}-batch-invariant", ops, Invariance.BATCH))
    if args.cublas and quantize is None:
        variants.append(("cublas", None, None))
    table = {}
    for label, ops, invariant in variants:
        for n in rows:
            calls = step_calls(model, ops, n, invariant)
            for call in calls:
                call()
            seconds = time_graph(calls, replays=5) * len(calls)
            row = dict(shape=args.shape, weights=quantize or "bf16", variant=label, rows=n,
                       ms=round(seconds * 1e3, 3), gb_s=round(nbytes / seconds / 1e9, 1))
            print(json.dumps(row), flush=True)
            table[label, n] = row["ms"]
            del calls
            torch.cuda.empty_cache()
    print(f"\nlinears of one step, ms ({args.shape}, {quantize or 'bf16'}, "
          f"{nbytes / 1e9:.2f} GB of weights)", file=sys.stderr)
    print(f"{'variant':<20}" + "".join(f"{n:>9}" for n in rows), file=sys.stderr)
    for label, _, _ in variants:
        print(f"{label:<20}" + "".join(f"{table.get((label, n), float('nan')):>9.3f}"
                                       for n in rows), file=sys.stderr)


if __name__ == "__main__":
    main()
