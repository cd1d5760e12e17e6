"""Compile Triton kernel specializations for sm90, without a GPU (test_triton_compiles.py).

Reads a JSON list of {module, name, args: {param: [kind, value]}, options} from stdin, compiles
each with Triton's compiler (``triton.compile`` of an ``ASTSource``: front end to cubin) for a
Hopper target, and writes the JSON list of the failures' messages to stdout. Run without
``TRITON_INTERPRET``, so that the kernels' modules hold ``JITFunction``s.
"""

from __future__ import annotations

import importlib
import json
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

TARGET = GPUTarget("cuda", 90, 32)


def jit_function(module: str, name: str) -> JITFunction:
    fn = importlib.import_module(module)
    for part in name.split("."):
        fn = getattr(fn, part)
    while not isinstance(fn, JITFunction):  # an autotuner or heuristics around it
        fn = fn.fn
    return fn


def scalar_type(kind: str, value) -> str:
    if kind == "int":
        return "i32" if -2**31 <= value < 2**31 else "i64"
    return {"float": "fp32", "bool": "i1"}[kind]


def source(spec: dict) -> ASTSource:
    """The kernel with the launch's types, its constexprs the launch's values (PDL on)."""
    fn = jit_function(spec["module"], spec["name"])
    signature, constexprs = {}, {}
    for i, param in enumerate(fn.params):
        if param.name in spec["args"]:
            kind, value = spec["args"][param.name]
        else:  # left to its default
            kind, value = "default", param.default
        if param.name == "PDL" and param.is_constexpr:
            value = True
        if param.is_constexpr or kind in ("none", "str", "default"):
            signature[param.name] = "constexpr"
            constexprs[(i,)] = value
        elif kind == "ptr":
            signature[param.name] = "*" + value
        else:
            signature[param.name] = scalar_type(kind, value)
    return ASTSource(fn, signature, constexprs)


def main():
    errors = []
    for spec in json.load(sys.stdin):
        try:
            triton.compile(source(spec), target=TARGET, options=spec["options"])
        except Exception as exc:  # noqa: BLE001 - every failure is reported
            args = {k: v[1] for k, v in spec["args"].items() if v[0] != "ptr"}
            errors.append(f"{spec['module']}.{spec['name']} {args}:\n{str(exc)[-1500:]}")
    json.dump(errors, sys.stdout)


if __name__ == "__main__":
    main()
