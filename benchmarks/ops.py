"""Per-op benchmark of every available GPU backend at Llama decode / prefill shapes.

Prints one JSON object per line (op, shape, backend, median_us, GB/s or TFLOP/s, the fraction of
the ceiling) and a short table at the end. Ceilings (DESIGN.md section 8, measured on the H200):
device copy 4.18 TB/s (decode GEMVs, decode attention: bytes read / time), bf16 matmul
770 TFLOP/s (prefill GEMM; also compared with cuBLAS through torch at the same shape). The copy
bandwidth is measured again at the start of each run and printed as the op "copy".

Timing: each measured call runs on its own copy of the weights / KV cache, cycling through
enough copies (>= 256 MB in all) that nothing is served from the 60 MB L2. The calls are captured
in a CUDA graph and replayed (the way a model runner issues decode steps: no launch overhead,
kernels back to back); an op that cannot be captured (the ref backend's attention reads lengths
on the host) is timed eagerly with CUDA events. Reported: the median over replays of the time
per call.

    python benchmarks/ops.py                    # everything (about 2-3 minutes on an H200)
    python benchmarks/ops.py --only gemv,attn   # op groups: copy gemv verify sweep gemm attn misc
                                                #   and cuda-sweep, cuda-attn-sweep, fp8-sweep
                                                #   (not in the default run)

The group "verify" times the triton GEMVs at 4, 8 and 16 tokens (the verify steps of speculative
decoding: up to 8 tokens every row runs the 1-token programs, bit-identical to a decode step;
16 tokens take the tensor-core tiles); its per_token rows give the GEMV time of such a step.
    python benchmarks/ops.py --out results.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time

import torch
from tileinfer.backend.types import AttentionStep, LayerKV, QKTransform

COPY_CEILING = 4.18e12  # bytes/s, DESIGN.md
MATMUL_CEILING = 770e12  # bf16 FLOP/s, DESIGN.md
ROTATE_BYTES = 256 << 20
MODELS = {
    "llama3-8b": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336, vocab=128256,
                      layers=32),
    "llama3.2-1b": dict(hidden=2048, heads=32, kv_heads=8, head_dim=64, inter=8192, vocab=128256,
                        layers=16),
}
DEV = "cuda"
DRY_RUN = False  # --dry-run: tiny shapes on the CPU (TRITON_INTERPRET=1) to check the script
CONTEXTS = (256, 1024, 8192, 16384, 32768)
# The Triton attention sweep: split targets tried per context, with (min_chunk) the shortest split.
# (Between 33 and 64 splits at 8k-32k: the blocks per SM that fit are 2-3, so 40-50 splits of
# the 8 kv heads are one wave where 64 are about two.)
SWEEP_SPLITS = {256: ((1, 256), (2, 64), (4, 64)), 1024: ((1, 1024), (4, 256), (8, 64), (16, 64)),
                8192: ((17, 256), (33, 256), (40, 64), (48, 64), (64, 64)),
                16384: ((33, 256), (40, 256), (48, 256), (64, 256)),
                32768: ((17, 256), (33, 256), (40, 256), (48, 256), (64, 256))}
PREFILL = 2048
ROWS: list[dict] = []
OUT_FILE = None


def emit(**row):
    ROWS.append(row)
    line = json.dumps(row)
    print(line, flush=True)
    if OUT_FILE is not None:
        OUT_FILE.write(line + "\n")
        OUT_FILE.flush()


# --- timing ----------------------------------------------------------------------------------


def _time_graph(calls, replays=7, min_calls=40):
    from timing import time_graph

    passes = max(1, math.ceil(min_calls / len(calls)))
    return time_graph(calls * passes, replays) * 1e6, "graph"


def _time_eager(calls, replays=7, min_calls=20):
    passes = max(1, math.ceil(min_calls / len(calls)))
    times = []
    for _ in range(replays):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(passes):
            for call in calls:
                call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (passes * len(calls)))
    return statistics.median(times), "eager"


def time_calls(calls, graph=True):
    """Median microseconds per call; calls: zero-argument callables on rotated inputs.
    graph=False for ops that read device values on the host (not capturable)."""
    if DRY_RUN:
        start = time.perf_counter()
        for call in calls[:2]:
            call()
        return (time.perf_counter() - start) * 1e6 / len(calls[:2]), "dry-run"
    for call in calls[:2]:  # compile / warm up (before any capture)
        call()
    torch.cuda.synchronize()
    if not graph:
        return _time_eager(calls)
    try:
        return _time_graph(calls)
    except Exception:  # not capturable (host reads): time it eagerly
        torch.cuda.synchronize()
        return _time_eager(calls)


def try_time(calls, graph=True, **row):
    """time_calls, or None after emitting an error row (one backend's failure does not stop
    the others)."""
    try:
        return time_calls(calls, graph=graph)
    except Exception as exc:  # report and go on
        if not DRY_RUN:
            try:
                torch.cuda.synchronize()
            except Exception:
                pass
        emit(**row, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        return None


def copies_for(nbytes: int) -> int:
    if DRY_RUN:
        return 2
    return max(2, min(64, math.ceil(ROTATE_BYTES / max(nbytes, 1))))


def backends():
    from tileinfer.backend.registry import list_backends

    kind = "cpu" if DRY_RUN else "cuda"
    return [b.name for b in list_backends() if b.available and kind in b.info.devices]


def _dry_run_setup():
    global DEV, DRY_RUN, CONTEXTS, PREFILL
    global SWEEP_SPLITS
    DEV, DRY_RUN, CONTEXTS, PREFILL = "cpu", True, (300, 700), 40
    SWEEP_SPLITS = {700: ((2, 64),)}
    for cfg in MODELS.values():
        cfg.update(hidden=cfg["hidden"] // 32, heads=4, kv_heads=2, head_dim=32,
                   inter=cfg["inter"] // 32, vocab=3000, layers=2)


# --- ops -------------------------------------------------------------------------------------


def bench_copy():
    n = 1 << 20 if DRY_RUN else 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device=DEV), torch.empty(n, dtype=torch.uint8, device=DEV)
    us, how = time_calls([lambda: dst.copy_(src)])
    bw = 2 * n / (us * 1e-6)
    emit(op="copy", shape="1 GiB", backend="torch", median_us=round(us, 2), GBps=round(bw / 1e9, 1),
         frac_of_ceiling=round(bw / COPY_CEILING, 3), timing=how)
    return bw


def _weights(n, k, int8, count):
    ws = []
    for _ in range(count):
        if int8:
            ws.append((torch.randint(-127, 128, (n, k), dtype=torch.int8, device=DEV),
                       torch.rand(n, device=DEV) * 1e-3 + 1e-4))
        else:
            ws.append(((torch.randn(n, k, device=DEV) * 0.02).to(torch.bfloat16), None))
    return ws


def decode_shapes(cfg):
    h, hd = cfg["hidden"], cfg["head_dim"]
    return {"qkv": ((cfg["heads"] + 2 * cfg["kv_heads"]) * hd, h, "linear"),
            "o": (h, cfg["heads"] * hd, "linear"),
            "gate_up": (2 * cfg["inter"], h, "swiglu"),
            "down": (h, cfg["inter"], "linear"),
            "lm_head": (cfg["vocab"], h, "linear")}


def _linear_calls(table, name, m, n, k, kind, int8, launch=None):
    wbytes = n * k * (1 if int8 else 2) + (4 * n if int8 else 0)
    ws = _weights(n, k, int8, copies_for(wbytes))
    x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
    n_out = n // 2 if kind == "swiglu" else n
    out = torch.empty(m, n_out, dtype=torch.float32 if name == "lm_head" else torch.bfloat16, device=DEV)
    scratch = torch.empty(m, n, dtype=torch.bfloat16, device=DEV)
    calls = []
    for w, s in ws:
        if launch is not None:
            calls.append(lambda w=w, s=s: launch(out, x, w, s))
        elif kind == "swiglu":
            calls.append(lambda w=w, s=s: table.linear_swiglu(out, x, w, s, scratch))
        else:
            calls.append(lambda w=w, s=s: table.linear(out, x, w, s))
    return calls, wbytes + x.numel() * 2 + out.numel() * out.element_size()


def bench_gemv(tables, summary, m=1):
    for model, cfg in MODELS.items():
        for int8 in (False, True):
            wtype = "int8" if int8 else "bf16"
            for backend, table in tables.items():
                total_us = 0.0
                for name, (n, k, kind) in decode_shapes(cfg).items():
                    calls, nbytes = _linear_calls(table, name, m, n, k, kind, int8)
                    timed = try_time(calls, op=f"gemv:{name}", model=model, weights=wtype,
                                     backend=backend)
                    if timed is None:
                        continue
                    us, how = timed
                    bw = nbytes / (us * 1e-6)
                    per_token = 1 if name == "lm_head" else cfg["layers"]
                    total_us += us * per_token
                    emit(op=f"gemv:{name}", model=model, shape=f"{m}x{n}x{k}", weights=wtype,
                         backend=backend, median_us=round(us, 2), GBps=round(bw / 1e9, 1),
                         frac_of_ceiling=round(bw / COPY_CEILING, 3), timing=how)
                    del calls
                emit(op="gemv:per_token", model=model, shape=f"m={m}", weights=wtype, backend=backend,
                     median_us=round(total_us, 1), tok_per_s_bound=round(1e6 / total_us, 1))
                summary.append((f"gemv/token {model}", wtype, backend, total_us, f"{1e6 / total_us:.0f} tok/s"))
                torch.cuda.empty_cache()


def gemv_sweep_configs():
    from tileinfer_backend_triton.kernels.linear import GemvConfig as G

    # The defaults (linear.gemv_config) are the first of each list (SwiGLU: block_n halved
    # below, so 8 x 256 bf16 / 4 x 512 int8); then neighbours of them, forced split-K (2, 4: more
    # programs for the small matrices of llama3.2-1b) and one step of a single tile.
    return {
        False: [G(8, 512, 0, 4, 3, 2), G(4, 512, 0, 4, 3, 2), G(8, 256, 0, 4, 3, 2),
                G(16, 256, 0, 4, 3, 2), G(4, 1024, 0, 4, 3, 2), G(8, 512, 1, 4, 3, 2),
                G(8, 512, 2, 4, 3, 2), G(8, 512, 4, 4, 3, 2), G(4, 512, 2, 4, 3, 2),
                G(8, 1024, 0, 4, 3, 1)],
        True: [G(8, 512, 0, 4, 3, 2), G(4, 512, 0, 4, 3, 2), G(4, 1024, 0, 4, 3, 2),
               G(8, 1024, 0, 4, 3, 2), G(8, 512, 1, 4, 3, 2), G(8, 512, 2, 4, 3, 2),
               G(8, 1024, 2, 4, 3, 2), G(16, 1024, 0, 8, 3, 2), G(4, 2048, 0, 4, 3, 2),
               G(2, 2048, 0, 4, 3, 2)],
    }


def bench_gemv_sweep(summary):
    """Triton GEMV tile candidates at every decode shape (data for choosing the defaults)."""
    from tileinfer_backend_triton.kernels import linear

    sweep = gemv_sweep_configs()
    table = []  # the winners as linear.GEMV_TABLE entries
    for model, cfg in MODELS.items():
        for int8 in (False, True):
            for name, (n, k, kind) in decode_shapes(cfg).items():
                act = linear.ACT_SWIGLU if kind == "swiglu" else linear.ACT_NONE
                best = None
                for c in sweep[int8]:
                    if act == linear.ACT_SWIGLU and not c.dot:  # gate + up row blocks
                        c = dataclasses.replace(c, block_n=max(4, c.block_n // 2))
                    launch = (lambda out, x, w, s, c=c:
                              linear.launch_linear(out, x, w, s, act=act, config=c))
                    calls, nbytes = _linear_calls(None, name, 1, n, k, kind, int8, launch)
                    try:
                        us, how = time_calls(calls)
                    except Exception as exc:
                        emit(op=f"sweep:{name}", model=model, config=str(c), error=repr(exc)[:200])
                        continue
                    bw = nbytes / (us * 1e-6)
                    emit(op=f"sweep:{name}", model=model, shape=f"1x{n}x{k}",
                         weights="int8" if int8 else "bf16", backend="triton", config=str(c),
                         median_us=round(us, 2), GBps=round(bw / 1e9, 1),
                         frac_of_ceiling=round(bw / COPY_CEILING, 3))
                    if best is None or us < best[0]:
                        best = (us, c, bw)
                    del calls
                if best:
                    summary.append((f"sweep best {model} {name}", "int8" if int8 else "bf16", "triton",
                                    best[0], f"{best[2] / COPY_CEILING:.2f} of copy; {best[1]}"))
                    table.append(f"    ({n // 2 if kind == 'swiglu' else n}, {k}, {int8}, {act}): "
                                 f"{best[1]},")
            torch.cuda.empty_cache()
    print("GEMV_TABLE = {  # tileinfer_backend_triton.kernels.linear\n" + "\n".join(table) + "\n}",
          file=sys.stderr)


def fp8_sweep_configs():
    from tileinfer_backend_triton.kernels.linear_fp8 import Fp8Config as C

    # fp8_config's rule first (block_n 16 or 32 at these shapes, K tiles of 128, 4 warps, 3
    # stages); then wider K tiles and deeper pipelines (more of the weight in flight a program).
    return [C(n, k, w, st) for n in (16, 32) for k in (128, 256, 512) for w in (4,)
            for st in (3, 4, 6)] + [C(16, 512, 8, 4), C(32, 512, 8, 4), C(64, 256, 8, 4)]


def bench_fp8_sweep(summary):
    """Triton's FP8 product (e4m3 weights, inputs quantized per token) at one token row, every
    decode shape but the LM head (FP8 models keep it in their dtype), for each configuration of
    fp8_sweep_configs; prints the winners as linear_fp8.FP8_TABLE entries."""
    from tileinfer_backend_triton.kernels import linear, linear_fp8

    from tileinfer.backend.fp8 import quantize_rows

    table = []
    for model, cfg in MODELS.items():
        for name, (n, k, kind) in decode_shapes(cfg).items():
            if name == "lm_head":
                continue
            act = linear.ACT_SWIGLU if kind == "swiglu" else linear.ACT_NONE
            n_out = n // 2 if kind == "swiglu" else n
            weights = [quantize_rows(torch.randn(n, k, device=DEV))
                       for _ in range(copies_for(n * k))]
            x = torch.randn(1, k, device=DEV).to(torch.bfloat16)
            out = torch.empty(1, n_out, dtype=torch.bfloat16, device=DEV)
            best = None
            for c in fp8_sweep_configs():
                calls = [lambda w=w, s=s, c=c: linear_fp8.launch_fp8(out, x, w, s, act=act,
                                                                     config=c)
                         for w, s in weights]
                try:
                    us, how = time_calls(calls)
                except Exception as exc:
                    emit(op=f"fp8-sweep:{name}", model=model, config=str(c), error=repr(exc)[:200])
                    continue
                bw = n * k / (us * 1e-6)
                emit(op=f"fp8-sweep:{name}", model=model, shape=f"1x{n}x{k}", weights="fp8",
                     backend="triton", config=str(c), median_us=round(us, 2),
                     GBps=round(bw / 1e9, 1), frac_of_ceiling=round(bw / COPY_CEILING, 3))
                if best is None or us < best[0]:
                    best = (us, c, bw)
            if best:
                summary.append((f"fp8 sweep best {model} {name}", "fp8", "triton", best[0],
                                f"{best[2] / COPY_CEILING:.2f} of copy; {best[1]}"))
                table.append(f"    ({n_out}, {k}, {act}): {best[1]},")
            del weights
            torch.cuda.empty_cache()
    print("FP8_TABLE = {  # tileinfer_backend_triton.kernels.linear_fp8\n" + "\n".join(table)
          + "\n}", file=sys.stderr)


def bench_cuda_rows_sweep(table, summary):
    """The CUDA backend's row-streaming GEMV configurations (cuda_kernels.gemv_rows_configs, each
    set through the backend's experiments switch) at every decode shape, timed as the per-op
    table times them; prints the winners as GEMV_ROWS_TABLE (tileinfer_backend_cuda/ops/tuning.py)."""
    import cuda_kernels

    device = torch.cuda.current_device()
    winners = []
    for model, cfg in MODELS.items():
        for int8 in (False, True):
            for name, (n, k, kind) in decode_shapes(cfg).items():
                epilogue = "swiglu" if kind == "swiglu" else "none"
                n_out = n // 2 if kind == "swiglu" else n
                best = None
                # the setting is read at each launch: the same calls time every config
                calls, nbytes = _linear_calls(table, name, 1, n, k, kind, int8)
                for c in cuda_kernels.gemv_rows_configs(n_out, k, int8, epilogue, device, wide=True):
                    with cuda_kernels.experiment(gemv={"kernel": "rows", **c}):
                        timed = try_time(calls, op=f"cuda-sweep:{name}", model=model, config=str(c))
                    if timed is None:
                        continue
                    us = timed[0]
                    emit(op=f"cuda-sweep:{name}", model=model, shape=f"1x{n}x{k}",
                         weights="int8" if int8 else "bf16", backend="cuda", config=str(c),
                         median_us=round(us, 2),
                         frac_of_ceiling=round(nbytes / (us * 1e-6) / COPY_CEILING, 3))
                    if best is None or us < best[0]:
                        best = (us, c, nbytes)
                del calls
                if best:
                    summary.append((f"cuda sweep best {model} {name}", "int8" if int8 else "bf16",
                                    "cuda", best[0],
                                    f"{best[2] / (best[0] * 1e-6) / COPY_CEILING:.3f} of copy; {best[1]}"))
                    winners.append(f"    ({n_out}, {k}, {int8}, {epilogue!r}): {best[1]},")
            torch.cuda.empty_cache()
    print("GEMV_ROWS_TABLE = {  # tileinfer_backend_cuda/ops/tuning.py\n" + "\n".join(winners)
          + "\n}", file=sys.stderr)


def bench_gemm(tables, summary):
    m = PREFILL
    cfg = MODELS["llama3-8b"]
    shapes = {k: v for k, v in decode_shapes(cfg).items() if k != "lm_head"}
    tlin, extra = None, {}  # Triton tile variants beside the default (tuning data)
    if "triton" in tables:
        from tileinfer_backend_triton.kernels import linear as tlin

        extra = {"triton[128x256x64 w8 s3]": tlin.GemmConfig(128, 256, 64, 8, 8, 3),
                 "triton[128x128x64 w4 s4]": tlin.GemmConfig(128, 128, 64, 8, 4, 4),
                 "triton[128x128x128 w8 s3]": tlin.GemmConfig(128, 128, 128, 8, 8, 3)}
    for name, (n, k, kind) in shapes.items():
        x = torch.randn(m, k, device=DEV).to(torch.bfloat16)
        w = (torch.randn(n, k, device=DEV) * 0.02).to(torch.bfloat16)
        flops = 2 * m * n * k
        out_t = torch.empty(m, n, dtype=torch.bfloat16, device=DEV)
        cublas_us, _ = time_calls([lambda: torch.matmul(x, w.t(), out=out_t)])
        emit(op=f"gemm:{name}", shape=f"{m}x{n}x{k}", weights="bf16", backend="torch(cuBLAS)",
             median_us=round(cublas_us, 1), TFLOPs=round(flops / cublas_us / 1e6, 1),
             frac_of_ceiling=round(flops / cublas_us / 1e6 / (MATMUL_CEILING / 1e12), 3))
        for int8 in (False, True):
            wq = (torch.randint(-127, 128, (n, k), dtype=torch.int8, device=DEV),
                  torch.rand(n, device=DEV) * 1e-3) if int8 else (w, None)
            n_out = n // 2 if kind == "swiglu" else n
            out = torch.empty(m, n_out, dtype=torch.bfloat16, device=DEV)
            scratch = torch.empty(m, n, dtype=torch.bfloat16, device=DEV)
            variants = {b: t for b, t in tables.items()}
            if not int8:
                variants.update({k2: v for k2, v in extra.items()})
            for backend, table in variants.items():
                if tlin is not None and isinstance(table, tlin.GemmConfig):
                    act = tlin.ACT_SWIGLU if kind == "swiglu" else tlin.ACT_NONE
                    if act == tlin.ACT_SWIGLU:  # two accumulators: 64 columns of each
                        table = dataclasses.replace(table, block_n=64)
                    call = (lambda c=table, act=act:
                            tlin.launch_linear(out, x, wq[0], wq[1], act=act, config=c))
                elif kind == "swiglu":
                    call = lambda t=table: t.linear_swiglu(out, x, wq[0], wq[1], scratch)
                else:
                    call = lambda t=table: t.linear(out, x, wq[0], wq[1])
                timed = try_time([call], op=f"gemm:{name}", weights="int8" if int8 else "bf16",
                                 backend=backend)
                if timed is None:
                    continue
                us, how = timed
                tf = flops / us / 1e6
                emit(op=f"gemm:{name}", shape=f"{m}x{n}x{k}", weights="int8" if int8 else "bf16",
                     backend=backend, median_us=round(us, 1), TFLOPs=round(tf, 1),
                     frac_of_ceiling=round(tf / (MATMUL_CEILING / 1e12), 3),
                     frac_of_cublas=round(cublas_us / us, 3), timing=how)
                if backend in tables:
                    summary.append((f"gemm {name} m{m}", "int8" if int8 else "bf16", backend, us,
                                    f"{cublas_us / us:.2f} of cuBLAS"))
        torch.cuda.empty_cache()


def _paged_cache(ctx, kv_heads, hd, page, int8, smooth=False):
    """A LayerKV of random pages for ctx positions (one spare page) and a block table over them
    in random order."""
    pages = math.ceil(ctx / page)
    shape = (pages + 1, page, kv_heads, hd)
    if int8:
        k = torch.randint(-127, 128, shape, dtype=torch.int8, device=DEV)
        v = torch.randint(-127, 128, shape, dtype=torch.int8, device=DEV)
        ks = torch.rand(shape[:3], device=DEV) * 0.02
        vs = torch.rand(shape[:3], device=DEV) * 0.02
        sm = torch.rand(kv_heads, hd, device=DEV) + 0.5 if smooth else None
    else:
        k = torch.randn(shape, device=DEV).to(torch.bfloat16)
        v = torch.randn(shape, device=DEV).to(torch.bfloat16)
        ks = vs = sm = None
    table = torch.randperm(pages, device=DEV).to(torch.int32)[None]
    return LayerKV(k, v, ks, vs, sm), table


def _step(n, ctx, table, max_ctx, positions=None, slots=None):
    """The AttentionStep of one sequence: n query tokens at the end of ctx cached positions."""
    if positions is None:
        positions = torch.empty(0, dtype=torch.int32, device=DEV)
    if slots is None:
        slots = torch.empty(0, dtype=torch.int64, device=DEV)
    return AttentionStep(positions, slots, torch.tensor([0, n], dtype=torch.int32, device=DEV),
                         torch.tensor([ctx], dtype=torch.int32, device=DEV), table, n, max_ctx)


@dataclasses.dataclass
class DecodeStep:
    """A 1-token decode step of the llama3-8b attention shape (pages of 16) at context ctx, on
    enough copies of the paged cache (each a LayerKV and its step's AttentionStep) that none
    stays in L2; nbytes: the K/V (and scale) bytes one call reads."""

    ctx: int
    kind: str  # "bf16" or "int8" pages
    heads: int
    head_dim: int
    copies: list  # (LayerKV, AttentionStep)
    q: torch.Tensor
    out: torch.Tensor
    max_ctx: int
    nbytes: int

    def calls(self, attention, ws):
        """One zero-argument call per cache copy of an op table's attention."""
        return [lambda kv=kv, st=st: attention(self.out, self.q, kv, st, self.head_dim ** -0.5,
                                               True, ws)
                for kv, st in self.copies]

    def kernel_calls(self, launch, ws, **settings):
        """The same calls of a kernel launcher that takes the tensors one by one (Triton's
        launch_attention) with its launch settings."""
        return [lambda kv=kv, st=st: launch(self.out, self.q, kv.k_cache, kv.v_cache, kv.k_scale,
                                            kv.v_scale, kv.k_smooth, st.cu_seqlens_q,
                                            st.context_lens, st.block_table, st.max_query_len,
                                            st.max_context_len, self.head_dim ** -0.5, True, ws,
                                            **settings)
                for kv, st in self.copies]


def _decode_step(ctx, kind):
    cfg = MODELS["llama3-8b"]
    heads, kvh, hd, page = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], 16
    int8 = kind == "int8"
    nbytes = 2 * ctx * kvh * hd * (1 if int8 else 2) + (2 * ctx * kvh * 4 if int8 else 0)
    caches = [_paged_cache(ctx, kvh, hd, page, int8) for _ in range(copies_for(nbytes))]
    max_ctx = caches[0][1].shape[1] * page
    q = torch.randn(1, heads, hd, device=DEV).to(torch.bfloat16)
    return DecodeStep(ctx, kind, heads, hd, [(kv, _step(1, ctx, t, max_ctx)) for kv, t in caches],
                      q, torch.empty_like(q), max_ctx, nbytes)


def bench_attention(tables, summary):
    cfg = MODELS["llama3-8b"]
    heads, kvh, hd, page = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], 16
    for kind in ("bf16", "int8"):
        for ctx in CONTEXTS:
            step = _decode_step(ctx, kind)
            nbytes = step.nbytes
            for backend, table in tables.items():
                ws = table.attention_workspace(1, heads, hd, step.max_ctx, step.q.device)
                calls = step.calls(table.attention, ws)
                timed = try_time(calls, graph=table.graph_safe, op="attn:decode", kv=kind,
                                 shape=f"ctx{ctx}", backend=backend)
                if timed is None:
                    continue
                us, how = timed
                bw = nbytes / (us * 1e-6)
                emit(op="attn:decode", shape=f"ctx{ctx} h{heads}/{kvh} d{hd} p{page}", kv=kind,
                     backend=backend, median_us=round(us, 2), GBps=round(bw / 1e9, 1),
                     frac_of_ceiling=round(bw / COPY_CEILING, 3), timing=how)
                summary.append((f"attn decode ctx{ctx}", kind, backend, us,
                                f"{bw / COPY_CEILING:.2f} of copy"))
            if "triton" in tables and ctx in SWEEP_SPLITS:
                _attention_sweep(step)
            del step
            torch.cuda.empty_cache()
    # prefill attention, PREFILL tokens causal (FLOPs: 4 * q * ctx / 2 * head_dim * heads)
    n = PREFILL
    for backend, table in tables.items():
        kv, bt = _paged_cache(n, kvh, hd, page, False)
        q = torch.randn(n, heads, hd, device=DEV).to(torch.bfloat16)
        out = torch.empty_like(q)
        step = _step(n, n, bt, bt.shape[1] * page)
        timed = try_time([lambda: table.attention(out, q, kv, step, hd ** -0.5, True, None)],
                         graph=table.graph_safe, op="attn:prefill", backend=backend)
        if timed is None:
            continue
        us, how = timed
        tf = 4 * n * n / 2 * hd * heads / us / 1e6
        emit(op="attn:prefill", shape=f"q{n} ctx{n} causal h{heads}/{kvh} d{hd}", kv="bf16",
             backend=backend, median_us=round(us, 1), TFLOPs=round(tf, 1), timing=how)
        summary.append((f"attn prefill {n}", "bf16", backend, us, f"{tf:.0f} TFLOP/s"))


def _attention_sweep(step):
    from tileinfer_backend_triton.kernels import attention

    ctx, kind, nbytes = step.ctx, step.kind, step.nbytes
    ws = attention.workspace(1, step.heads, step.head_dim, step.max_ctx, step.q.device)
    for tiles in ((16, 64, 4, 3), (16, 32, 4, 3), (16, 128, 4, 3), (16, 64, 4, 2), (16, 64, 4, 4),
                  (16, 128, 8, 3)):
        for splits, min_chunk in SWEEP_SPLITS[ctx]:
            calls = step.kernel_calls(attention.launch_attention, ws, tiles=tiles, splits=splits,
                                      min_chunk=min_chunk)
            try:
                us, _ = time_calls(calls)
            except Exception as exc:
                emit(op="sweep:attn", tiles=str(tiles), splits=splits, error=repr(exc)[:200])
                continue
            bw = nbytes / (us * 1e-6)
            emit(op="sweep:attn", shape=f"ctx{ctx}", kv=kind, backend="triton", tiles=str(tiles),
                 splits=splits, min_chunk=min_chunk, median_us=round(us, 2), GBps=round(bw / 1e9, 1),
                 frac_of_ceiling=round(bw / COPY_CEILING, 3))


# The CUDA decode attention's launch settings tried by cuda-attn-sweep: the backend's
# experiments' "attention" settings (keys of tileinfer_backend_cuda.ops.tuning.ATTN_CONFIG, and
# "splits").
CUDA_ATTN_SWEEP = ([{"decode_blocks_per_sm": b, "decode_stages": s}
                    for b in (1, 2, 3, 4) for s in (0, 2, 3)]
                   + [{"decode_blocks_per_sm": b, "decode_stages": 1} for b in (3, 4)]
                   + [{"splits": n} for n in (8, 16, 24, 48)])


def bench_cuda_attention_sweep(table, summary):
    """The CUDA decode attention at the 8B shape under each CUDA_ATTN_SWEEP setting (split
    target x ring depth), bf16 and INT8 pages, at 8k and 32k context."""
    import cuda_kernels

    cfg = MODELS["llama3-8b"]
    heads, kvh, hd, page = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], 16
    contexts = [c for c in CONTEXTS if c >= 8192] or list(CONTEXTS)
    best = {}
    for kind in ("bf16", "int8"):
        for ctx in contexts:
            step = _decode_step(ctx, kind)
            nbytes = step.nbytes
            ws = table.attention_workspace(1, heads, hd, step.max_ctx, step.q.device)
            calls = step.calls(table.attention, ws)
            for setting in CUDA_ATTN_SWEEP:
                with cuda_kernels.experiment(attention=setting):
                    timed = try_time(calls, op="cuda-attn-sweep", kv=kind, shape=f"ctx{ctx}",
                                     config=str(setting))
                if timed is None:
                    continue
                us = timed[0]
                emit(op="cuda-attn-sweep", shape=f"ctx{ctx} h{heads}/{kvh} d{hd} p{page}", kv=kind,
                     backend="cuda", config=str(setting), median_us=round(us, 2),
                     frac_of_ceiling=round(nbytes / (us * 1e-6) / COPY_CEILING, 3))
                if (kind, ctx) not in best or us < best[kind, ctx][0]:
                    best[kind, ctx] = (us, setting, nbytes)
            del calls, step
            torch.cuda.empty_cache()
    for (kind, ctx), (us, setting, nbytes) in best.items():
        summary.append((f"cuda attn sweep best ctx{ctx}", kind, "cuda", us,
                        f"{nbytes / (us * 1e-6) / COPY_CEILING:.2f} of copy; {setting}"))


def bench_misc(tables, summary):
    cfg = MODELS["llama3-8b"]
    h, heads, kvh, hd = cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    for backend, table in tables.items():
        res = torch.randn(1, h, device=DEV).to(torch.bfloat16)
        delta, out = torch.randn_like(res), torch.empty_like(res)
        w = torch.ones(h, dtype=torch.bfloat16, device=DEV)
        timed = try_time([lambda: table.add_rmsnorm(res, out, delta, w, 1e-5)], op="add_rmsnorm",
                         backend=backend)
        if timed is None:
            continue
        us, how = timed
        emit(op="add_rmsnorm", shape=f"1x{h}", backend=backend, median_us=round(us, 2), timing=how)
        summary.append((f"add_rmsnorm 1x{h}", "bf16", backend, us, ""))
        for kind in ("bf16", "int8"):
            kv, bt = _paged_cache(4096, kvh, hd, 16, kind == "int8")
            qkv = torch.randn(1, (heads + 2 * kvh) * hd, device=DEV).to(torch.bfloat16)
            q_out = torch.empty(1, heads, hd, dtype=torch.bfloat16, device=DEV)
            ang = torch.arange(8192, device=DEV)[:, None] * torch.rand(hd // 2, device=DEV)[None]
            qk = QKTransform(ang.cos(), ang.sin(), None, None, 1e-6)
            step = _step(1, 4001, bt, bt.shape[1] * 16,
                         torch.tensor([4000], dtype=torch.int32, device=DEV),
                         torch.tensor([4000], dtype=torch.int64, device=DEV))
            timed = try_time([lambda: table.attention_inputs(q_out, kv, qkv, qk, step)],
                             op="attention_inputs", kv=kind, backend=backend)
            if timed is None:
                continue
            us, how = timed
            emit(op="attention_inputs", shape=f"1 tok h{heads}/{kvh} d{hd}", kv=kind, backend=backend,
                 median_us=round(us, 2), timing=how)
            summary.append(("attention_inputs decode", kind, backend, us, ""))
        vocab = cfg["vocab"]
        logits = [torch.randn(1, vocab, device=DEV) * 3 for _ in range(4)]
        tok = torch.empty(1, dtype=torch.int32, device=DEV)
        seed = torch.tensor([1], device=DEV)
        counter = torch.tensor([0], device=DEV)
        for label, (t, k_, p) in {"greedy": (0.0, 0, 1.0), "t1.0": (1.0, 0, 1.0),
                                  "t0.8 k50": (0.8, 50, 1.0), "t0.8 p0.9": (0.8, 0, 0.9),
                                  "t0.8 k50 p0.9": (0.8, 50, 0.9)}.items():
            timed = try_time([lambda lg=lg: table.sample_tokens(tok, lg, t, k_, p, seed, counter, None)
                              for lg in logits], op="sample_tokens", shape=label, backend=backend)
            if timed is None:
                continue
            us, how = timed
            emit(op="sample_tokens", shape=f"1x{vocab} {label}", backend=backend,
                 median_us=round(us, 2), timing=how)
            summary.append((f"sample {label}", "fp32", backend, us, ""))


def main():
    global OUT_FILE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="copy,gemv,verify,sweep,gemm,attn,misc")
    parser.add_argument("--backends", default="", help="comma list (default: every available GPU backend)")
    parser.add_argument("--out", default="", help="also write the JSON lines to this file")
    parser.add_argument("--triton-pdl", choices=("on", "off"), default="on",
                        help="programmatic dependent launch of the Triton kernels (default on)")
    parser.add_argument("--cuda-attn-configs", type=json.loads, default=None,
                        help="JSON list of the cuda backend's attention experiment settings "
                             "(tuning.ATTN_CONFIG keys, \"splits\") for cuda-attn-sweep "
                             "(default: CUDA_ATTN_SWEEP), e.g. '[{}, {\"decode_stages\": 0}]'")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny shapes on the CPU (with TRITON_INTERPRET=1): checks the script")
    args = parser.parse_args()
    if args.cuda_attn_configs is not None:
        CUDA_ATTN_SWEEP[:] = args.cuda_attn_configs
    if args.dry_run:
        _dry_run_setup()
    elif not torch.cuda.is_available():
        sys.exit("benchmarks/ops.py needs a CUDA GPU")
    from tileinfer.backend.registry import get_backend

    names = [b for b in args.backends.split(",") if b] or backends()
    if "triton" in names and not DRY_RUN:
        from tileinfer_backend_triton.kernels.common import set_pdl

        set_pdl(args.triton_pdl == "on")
    tables = {name: get_backend(name) for name in names}
    only = set(args.only.split(","))
    if args.out:
        OUT_FILE = open(args.out, "w")
    emit(op="info", gpu="cpu (dry run)" if DRY_RUN else torch.cuda.get_device_name(),
         torch=torch.__version__, triton_pdl=args.triton_pdl,
         backends=list(tables), date=time.strftime("%Y-%m-%d"))
    summary = []
    t0 = time.time()
    torch.manual_seed(0)
    if "copy" in only:
        bench_copy()
    if "gemv" in only:
        bench_gemv(tables, summary)
    if "verify" in only and "triton" in tables:
        for m in (4, 8, 16):
            bench_gemv({"triton": tables["triton"]}, summary, m=m)
    if "sweep" in only and "triton" in tables:
        bench_gemv_sweep(summary)
    if "fp8-sweep" in only and "triton" in tables:
        bench_fp8_sweep(summary)
    if "cuda-sweep" in only and "cuda" in tables:
        bench_cuda_rows_sweep(tables["cuda"], summary)
    if "cuda-attn-sweep" in only and "cuda" in tables:
        bench_cuda_attention_sweep(tables["cuda"], summary)
    if "gemm" in only:
        bench_gemm(tables, summary)
    if "attn" in only:
        bench_attention(tables, summary)
    if "misc" in only:
        bench_misc(tables, summary)
    print(f"\n{'what':34s} {'dtype':6s} {'backend':8s} {'us':>10s}  note")
    for what, dtype, backend, us, note in summary:
        print(f"{what:34s} {dtype:6s} {backend:8s} {us:10.2f}  {note}")
    print(f"\n(total {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
