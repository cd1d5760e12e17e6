"""Compile every kernel variant the launchers produce for an H100/H200 (sm_90a), without a GPU.

The interpreter (CI) checks the kernels' arithmetic, not that they compile: this drives the real
launchers with CPU tensors of the real model shapes while Triton's driver is replaced by one that
reports an sm_90 target, so each launch compiles (Triton's bundled ptxas) instead of running.
For each kernel it prints registers, spills, shared memory and what its SASS uses (HGMMA = wgmma,
HMMA = mma.sync, 128-bit global loads), e.g.

    python packages/tileinfer-backend-triton/tools/compile_sm90.py            # all
    python packages/tileinfer-backend-triton/tools/compile_sm90.py gemv attn  # name filters
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SM_COUNT = 132


class _CompileOnlyDriver:
    """Enough of a driver for JITFunction.run(warmup=True): a target, a device, a stream."""

    def get_current_target(self):
        return TARGET

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


RESULTS = []
_current_label = [""]
_real_run = JITFunction.run


def _compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _real_run(self, *args, grid=grid, warmup=True, **kwargs)
    RESULTS.append((_current_label[0], self.fn.__name__, kernel, kwargs.get("num_warps"),
                    kwargs.get("num_stages"), grid))
    return kernel


def _cuobjdump():
    import triton.backends.nvidia as nv

    return os.path.join(os.path.dirname(nv.__file__), "bin", "cuobjdump")


def _inspect(kernel):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
        path = f.name
    try:
        usage = subprocess.run([_cuobjdump(), "--dump-resource-usage", path], capture_output=True,
                               text=True).stdout
        sass = subprocess.run([_cuobjdump(), "--dump-sass", path], capture_output=True,
                              text=True).stdout
    finally:
        os.unlink(path)
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    shared = kernel.metadata.shared
    flags = [name for name, pat in (("HGMMA", "HGMMA"), ("HMMA", "HMMA"), ("LDG.128", r"LDG\.E\.128"),
                                    ("LDGSTS", "LDGSTS"), ("UTMALDG", "UTMALDG"),
                                    ("LDL/STL", r"\b(LDL|STL)\b"), ("I2F", r"\bI2F")) if re.search(pat, sass)]
    return (int(regs.group(1)) if regs else -1, int(stack.group(1)) if stack else -1, shared, flags)


def cases():
    """(label, thunk) pairs: launches at the shapes the benchmark and the models use."""
    from tileinfer_backend_triton.kernels import attention, linear, norms, rope_kv, sampling
    from tileinfer_backend_triton.kernels import activations, common, embed

    for mod in (linear, attention):
        mod.sm_count = lambda device: SM_COUNT
    # Compile as an sm_90 GPU runs them: with programmatic dependent launch (griddepcontrol).
    common.PDL_SUPPORTED = True
    common.set_pdl(os.environ.get("TILEINFER_TRITON_PDL", "1") != "0")
    bf, i8, f32 = torch.bfloat16, torch.int8, torch.float32
    e = torch.empty

    def lin(label, m, n, k, wdt=bf, act=linear.ACT_NONE, xdt=bf, odt=bf):
        rows = 2 * n if act == linear.ACT_SWIGLU else n

        def run():
            x, w = e(m, k, dtype=xdt), e(rows, k, dtype=wdt)
            scale = e(rows, dtype=f32) if wdt == i8 else None
            linear.SCRATCH._by_device[("cpu", None)] = (e(1 << 21, dtype=f32), e(1 << 15, dtype=torch.int32))
            linear.launch_linear(e(m, n, dtype=odt), x, w, scale, act=act)
        return label, run

    for m in (1, 8, 16):  # 1 and 8: the row programs (verify steps); 16: the dot tiles
        for wdt in (bf, i8):
            tag = f"gemv m{m} {'int8' if wdt == i8 else 'bf16'}"
            yield lin(f"{tag} qkv 6144x4096", m, 6144, 4096, wdt)
            yield lin(f"{tag} o 4096x4096", m, 4096, 4096, wdt)
            yield lin(f"{tag} swiglu 2x14336x4096", m, 14336, 4096, wdt, linear.ACT_SWIGLU)
            yield lin(f"{tag} down 4096x14336", m, 4096, 14336, wdt)
            yield lin(f"{tag} lm_head 128256x4096", m, 128256, 4096, wdt, odt=f32)
    yield lin("gemv m1 xielu 8192x2048", 1, 8192, 2048, bf, linear.ACT_XIELU)
    yield lin("gemv m1 f32", 1, 256, 512, f32, xdt=f32, odt=f32)
    yield lin("gemv m3 f32", 3, 256, 512, f32, xdt=f32, odt=f32)
    for wdt in (bf, i8):
        tag = f"gemm m2048 {'int8' if wdt == i8 else 'bf16'}"
        yield lin(f"{tag} qkv 6144x4096", 2048, 6144, 4096, wdt)
        yield lin(f"{tag} swiglu 2x14336x4096", 2048, 14336, 4096, wdt, linear.ACT_SWIGLU)
    yield lin("gemm m64 f32", 64, 256, 512, f32, xdt=f32, odt=f32)

    def attn(label, q_len, ctx, heads, kvh, hd, page, kind, batch=1, causal=True):
        def run():
            n = q_len * batch
            pages = batch * (ctx // page + 1) + 1
            cdt = i8 if kind != "bf16" else bf
            kc, vc = e(pages, page, kvh, hd, dtype=cdt), e(pages, page, kvh, hd, dtype=cdt)
            ks = vs = sm = None
            if kind != "bf16":
                ks, vs = e(pages, page, kvh, dtype=f32), e(pages, page, kvh, dtype=f32)
                if kind == "int8-smooth":
                    sm = e(kvh, hd, dtype=f32)
            q = e(n, heads, hd, dtype=bf)
            cu = torch.arange(0, n + 1, q_len, dtype=torch.int32)
            ctxs = torch.full((batch,), ctx, dtype=torch.int32)
            table = torch.zeros(batch, ctx // page + 1, dtype=torch.int32)
            ws = attention.workspace(n, heads, hd, ctx, "cpu")
            attention.launch_attention(torch.empty_like(q), q, kc, vc, ks, vs, sm, cu, ctxs, table,
                                       q_len, ctx, hd ** -0.5, causal, ws)
        return label, run

    for kind in ("bf16", "int8", "int8-smooth"):
        yield attn(f"attn decode 32k {kind} h32/8 d128 p16", 1, 32768, 32, 8, 128, 16, kind)
        yield attn(f"attn prefill 2048 {kind} h32/8 d128 p16", 2048, 2048, 32, 8, 128, 16, kind)
    yield attn("attn decode 8k bf16 h32/8 d64 p64", 1, 8192, 32, 8, 64, 64, "bf16")
    yield attn("attn verify q8 bf16 h32/8 d128", 8, 4096, 32, 8, 128, 16, "bf16")
    yield attn("attn verify q8 int8-smooth h32/8 d128", 8, 4096, 32, 8, 128, 16, "int8-smooth")
    yield attn("attn q12 bf16 h32/8 d128", 12, 4096, 32, 8, 128, 16, "bf16")
    yield attn("attn dflash q16 noncausal bf16", 16, 4096, 32, 8, 128, 16, "bf16", causal=False)
    yield attn("attn prefill 2048 bf16 h32/8 d64", 2048, 2048, 32, 8, 64, 16, "bf16")

    def simple(label, fn):
        return label, fn

    yield simple("add_rmsnorm 1x4096", lambda: norms.launch_rmsnorm(
        e(1, 4096, dtype=bf), e(1, 4096, dtype=bf), e(4096, dtype=bf), 1e-5,
        residual_delta=e(1, 4096, dtype=bf)))
    yield simple("rmsnorm heads 8x32x128", lambda: norms.launch_rmsnorm(
        e(8, 32, 128, dtype=bf), e(8, 32, 128, dtype=bf), e(128, dtype=bf), 1e-6))
    yield simple("silu_mul", lambda: activations.launch_silu_mul(e(4, 14336, dtype=bf), e(4, 28672, dtype=bf)))
    yield simple("xielu", lambda: activations.launch_xielu(e(4, 8192, dtype=bf), e(4, 8192, dtype=bf), .8, .9, .5, -1e-6))
    yield simple("embed", lambda: embed.launch_embed(e(4, 4096, dtype=bf), e(1000, 4096, dtype=bf), e(4, dtype=torch.int32)))
    yield simple("rope", lambda: rope_kv.launch_rope(e(4, 32, 128, dtype=bf), e(4, 32, 128, dtype=bf), e(512, 64), e(512, 64), e(4, dtype=torch.int32)))
    for kind in ("bf16", "int8"):
        cdt = i8 if kind == "int8" else bf
        sc = (e(100, 16, 8, dtype=f32), e(100, 16, 8, dtype=f32)) if kind == "int8" else (None, None)
        yield simple(f"store_kv {kind}", lambda cdt=cdt, sc=sc: rope_kv.launch_store_kv(
            e(100, 16, 8, 128, dtype=cdt), e(100, 16, 8, 128, dtype=cdt), *sc,
            e(8, 128) if sc[0] is not None else None, e(4, 8, 128, dtype=bf), e(4, 8, 128, dtype=bf),
            e(4, dtype=torch.int64)))
        yield simple(f"attention_inputs {kind} qknorm", lambda cdt=cdt, sc=sc: rope_kv.launch_attention_inputs(
            e(4, 32, 128, dtype=bf), e(100, 16, 8, 128, dtype=cdt), e(100, 16, 8, 128, dtype=cdt), *sc,
            e(8, 128) if sc[0] is not None else None, e(4, 48 * 128, dtype=bf), e(128, dtype=bf),
            e(128, dtype=bf), e(512, 64), e(512, 64), e(4, dtype=torch.int32), e(4, dtype=torch.int64), 1e-6))
    # Conformance-sized shapes: ints equal to 1 (one KV head, one row, top_k=1) are compile-time
    # constants in Triton; strides of size-1 dims and odd sizes take other specializations.
    yield lin("small linear 1x64->96", 1, 96, 64)
    yield lin("small linear 3x136->200 int8 f32out", 3, 200, 136, i8, odt=f32)
    yield lin("small swiglu 37x128->256", 37, 256, 128, bf, linear.ACT_SWIGLU)
    yield lin("small xielu 4x136->200 int8", 4, 200, 136, i8, linear.ACT_XIELU)
    yield attn("small attn q1 ctx77 h8/1 d128", 1, 77, 8, 1, 128, 16, "int8-smooth")
    yield attn("small attn q4 ctx40 h4/4 d64 p64", 4, 40, 4, 4, 64, 64, "bf16", causal=False)
    yield attn("small attn q37 h8/2 d64", 37, 37, 8, 2, 64, 16, "int8")
    yield attn("small attn batch3 decode h8/2", 1, 300, 8, 2, 64, 16, "bf16", batch=3)
    yield simple("small rmsnorm 1x64", lambda: norms.launch_rmsnorm(
        e(1, 64, dtype=f32), e(1, 64, dtype=f32), e(64, dtype=f32), 1e-5))
    yield simple("small attention_inputs h4/1 d64 int8-smooth", lambda: rope_kv.launch_attention_inputs(
        e(1, 4, 64, dtype=bf), e(5, 16, 1, 64, dtype=i8), e(5, 16, 1, 64, dtype=i8),
        e(5, 16, 1, dtype=f32), e(5, 16, 1, dtype=f32), e(1, 64), e(1, 6 * 64, dtype=bf), None, None,
        e(64, 32), e(64, 32), e(1, dtype=torch.int32), e(1, dtype=torch.int64), 1e-6))
    seed, counter = e(1, dtype=torch.int64), e(1, dtype=torch.int64)
    yield simple("small sample 1x1000 top_k=1", lambda: sampling.launch_sample(
        e(1, dtype=torch.int32), e(1, 1000), 1.0, 1, 1.0, seed, counter, e(1, 1000)))
    yield simple("small accept 64x500 one-hot q", lambda: sampling.launch_accept(
        e(64, dtype=torch.int32), e(64, 500), e(64, dtype=torch.int32), None, 0.7, 20, 1.0,
        seed, counter))
    for t in (0.0, 1.0):  # greedy / plain temperature without probabilities: the split argmax
        yield simple(f"sample split t{t}", lambda t=t: sampling.launch_sample(
            e(1, dtype=torch.int32), e(1, 128256), t, 0, 1.0, seed, counter, None))
    for (t, k, p) in ((0.0, 0, 1.0), (1.0, 0, 1.0), (0.8, 50, 0.9)):
        yield simple(f"sample t{t} k{k} p{p}", lambda t=t, k=k, p=p: sampling.launch_sample(
            e(4, dtype=torch.int32), e(4, 128256), t, k, p, seed, counter, e(4, 128256)))
        yield simple(f"accept t{t} k{k} p{p}", lambda t=t, k=k, p=p: sampling.launch_accept(
            e(4, dtype=torch.int32), e(4, 128256), e(4, dtype=torch.int32), e(4, 128256), t, k, p,
            seed, counter))


def main(filters):
    driver.set_active(_CompileOnlyDriver())
    JITFunction.run = _compile_only
    failures = 0
    print(f"{'case':48s} {'kernel':22s} {'warps':>5s} {'stg':>3s} {'regs':>4s} {'stack':>5s} "
          f"{'smem':>6s}  sass")
    for label, thunk in cases():
        if filters and not any(f in label for f in filters):
            continue
        _current_label[0] = label
        start = len(RESULTS)
        try:
            thunk()
        except Exception as exc:  # report and continue with the other variants
            failures += 1
            print(f"{label:48s} FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        for _, name, kernel, warps, stages, grid in RESULTS[start:]:
            regs, stack, shared, flags = _inspect(kernel)
            print(f"{label:48s} {name:22s} {warps or 4:5d} {stages or 0:3d} {regs:4d} {stack:5d} "
                  f"{shared:6d}  {' '.join(flags)}  grid={tuple(grid)}")
        sys.stdout.flush()
    return failures


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1:]) else 0)
