"""Every Triton kernel that a tiny model's steps launch also compiles for a Hopper GPU.

Triton's interpreter (``TRITON_INTERPRET=1``, how the CPU tests run the kernels) executes a kernel
as Python on arrays and never checks what Triton's compiler checks: both branches of an ``if`` on
a runtime value giving values of one shape, for one. So a kernel can pass every CPU test and fail
to compile on a GPU. Here the launches of a tiny model's steps on the triton backend are recorded
under the interpreter (prefill, decode and verify steps, windowed and non-causal attention, INT8
KV, INT8 and FP8 weights, a batched engine step), and each distinct specialization is compiled
for sm90 by Triton's own compiler, which needs no GPU, in a process without the interpreter
(with PDL on where a kernel takes it, as on Hopper). The block sizes are the ones the launchers
chose for these shapes; a GPU's shapes may choose others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import astuple
from pathlib import Path

import pytest
import torch

from tileinfer import LLMEngine, NgramProposer, SamplingParams, generate, load_model
from tileinfer.backend.hookspecs import Invariance
from tileinfer.backend.registry import BackendError, get_backend
from tileinfer.testing.conformance import (CACHE_KINDS, XIELU, Cache, attention_step,
                                           fill_paged_step, rope_tables)
from tiny_models import tiny  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="records launches under Triton's interpreter")

# Triton's names of the tensor dtypes the kernels take.
POINTEE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
           torch.int8: "i8", torch.uint8: "u8", torch.int32: "i32", torch.int64: "i64",
           torch.float8_e4m3fn: "fp8e4nv"}
OPTIONS = ("num_warps", "num_stages")  # a launch's keywords that are compile options

COMPILE = Path(__file__).with_name("triton_compile_specs.py")


def package_kernels() -> set:
    """The kernels of the backend's ``kernels`` package (its ``*_kernel`` functions, which the
    launchers launch; the other jitted functions are called inside them)."""
    import importlib
    import pkgutil

    from triton.runtime.interpreter import InterpretedFunction

    import tileinfer_backend_triton.kernels as package

    names = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        names |= {name for name, value in vars(module).items()
                  if isinstance(value, InterpretedFunction) and name.endswith("_kernel")
                  and value.fn.__module__ == module.__name__}
    return names


def described(value):
    """A launch argument as [kind, value] in JSON."""
    if isinstance(value, torch.Tensor):
        return ["ptr", POINTEE[value.dtype]]
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return [kind.__name__, value]
    if value is None:
        return ["none", None]
    raise TypeError(f"a launch argument of type {type(value).__name__}")


@pytest.fixture
def launches(monkeypatch) -> dict:
    """The specializations launched from now on: JSON text -> {module, name, args, options}."""
    from triton.runtime.interpreter import InterpretedFunction

    seen = {}
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        named = dict(zip(self.arg_names, args))
        named.update((k, v) for k, v in kwargs.items() if k in self.arg_names)
        spec = {"module": self.fn.__module__, "name": self.fn.__qualname__,
                "args": {k: described(v) for k, v in named.items()},
                "options": {k: kwargs[k] for k in OPTIONS if k in kwargs}}
        seen.setdefault(json.dumps(spec, sort_keys=True), spec)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", run)
    return seen


def compile_errors(specs: list, tmp_path) -> list:
    """The specializations that Triton's compiler refuses for sm90, with its message."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    done = subprocess.run([sys.executable, str(COMPILE)], input=json.dumps(specs), env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def launch_each_op_apart(ops):
    """The kernels a model's steps fuse away or may not choose: RoPE and the KV store apart,
    the activations unfused, the tiled product, row programs of several rows, batch-invariant
    products in K segments, non-causal and split-KV attention, a sampled draft's acceptance."""
    from tileinfer_backend_triton.kernels import activations, linear, rope_kv

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 64, generator=gen).bfloat16()
    cos, sin = rope_tables(64, 64, "cpu")
    rope_kv.launch_rope(torch.empty_like(x), x, cos, sin, torch.tensor([0, 5, 9],
                                                                       dtype=torch.int32))
    for kind in CACHE_KINDS:
        cache = Cache(4, 16, 2, 64, kind, "cpu")
        k, v = x[:, :2].contiguous(), x[:, 2:].contiguous()
        rope_kv.launch_store_kv(*cache.pools(), k, v, torch.tensor([1, 17, 40]))
    gate_up = torch.randn(2, 128, generator=gen).bfloat16()
    activations.launch_silu_mul(torch.empty(2, 64, dtype=torch.bfloat16), gate_up)
    activations.launch_xielu(torch.empty_like(gate_up), gate_up, *astuple(XIELU))
    x = torch.randn(160, 128, generator=gen).bfloat16()  # past the skinny shapes
    for weight in (x[:96], (x[:96] * 20).to(torch.int8)):
        scale = torch.ones(96) if weight.dtype == torch.int8 else None
        linear.launch_linear(torch.empty(160, 96, dtype=torch.bfloat16), x, weight, scale,
                             invariant=False)
    # a sequence's steps on row programs of 4 rows (GemvConfig.rows_per_program), plain and SwiGLU
    rows4 = linear.GemvConfig(block_n=4, block_k=64, unroll=2, rows_per_program=4)
    weight = torch.randn(192, 128, generator=gen).bfloat16()
    for act, width in ((linear.ACT_NONE, 96), (linear.ACT_SWIGLU, 192)):
        linear.launch_linear(torch.empty(5, 96, dtype=torch.bfloat16), x[:5], weight[:width],
                             None, act=act, config=rows4)
    # batch-invariant steps over two K segments: split across programs (1 row) and one after
    # another in a program (40 rows), plain and SwiGLU
    x = torch.randn(40, 576, generator=gen).bfloat16()
    weight = torch.randn(192, 576, generator=gen).bfloat16()
    for m in (1, 40):
        for act, width in ((linear.ACT_NONE, 96), (linear.ACT_SWIGLU, 192)):
            linear.launch_linear(torch.empty(m, 96, dtype=torch.bfloat16), x[:m],
                                 weight[:width], None, act=act, invariant=Invariance.BATCH)
    logits = torch.randn(4, 700, generator=gen)
    ops.accept_tokens(torch.empty(4, dtype=torch.int32), logits,
                      torch.tensor([1, 2, 3, 4], dtype=torch.int32), None, 0.8, 40, 0.9,
                      torch.tensor([7]), torch.tensor([0]))
    q, cache, cu, ctx, table = fill_paged_step([9, 1], [9, 40], 4, 2, 64, 16, "bf16", "cpu", gen)
    max_ctx = table.shape[1] * 16
    step = attention_step(cu, ctx, table, 9, max_ctx)
    ops.attention(torch.empty_like(q), q, cache.kv, step, 0.125, False, None)
    q1 = q[-1:].contiguous()
    cu1 = torch.tensor([0, 1], dtype=torch.int32)
    step = attention_step(cu1, ctx[1:], table[1:], 1, max_ctx)
    ws = ops.attention_workspace(1, 4, 64, max_ctx, q.device)
    ops.attention(torch.empty_like(q1), q1, cache.kv, step, 0.125, True, ws)


def test_every_launched_specialization_compiles_for_sm90(tiny, launches, tmp_path):  # noqa: F811
    try:
        ops = get_backend("triton")
    except BackendError as exc:
        pytest.skip(str(exc))
    greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=40)
    prompt = list(range(3, 15)) + list(range(3, 7))  # repeats itself: the lookup drafts
    for arch, quantize, kv in (("gemma3", None, None), ("apertus", "int8", "int8"),
                               ("llama", "fp8", None)):
        if quantize == "fp8" and not ops.backend.info.fp8:
            continue
        model = load_model(tiny.directory(arch, dtype=torch.bfloat16), dtype=torch.bfloat16,
                           backend="triton", max_len=64, quantize=quantize)
        generate(model, prompt, 3, greedy, kv_quantize=kv, speculative=NgramProposer())
    generate(model, prompt, 3, sampled, seed=1, speculative=NgramProposer())
    engine = LLMEngine(model, max_running=4)
    for n, sampling in ((5, greedy), (18, sampled)):
        engine.add_request(list(range(4, 4 + n)), sampling=sampling, max_new_tokens=2, seed=2)
    while engine.has_unfinished():
        engine.step()
    launch_each_op_apart(ops)

    specs = list(launches.values())
    missing = package_kernels() - {s["name"] for s in specs}
    assert not missing, f"kernels the steps above did not launch: {sorted(missing)}"
    errors = compile_errors(specs, tmp_path)
    assert not errors, "\n\n".join(errors)
