"""A faster Triton interpreter for the CPU tests (TRITON_INTERPRET=1), semantics unchanged.

Triton's interpreter patches triton.language's builtins at every kernel launch and again at
every call of a nested ``@triton.jit`` function, each time finding them with
``inspect.getmembers`` of the whole module (most of the patching's cost; a nested call finds the
builtins already patched and patches nothing new). The names of a module's builtins do not
change, so they are found once here, at the first (unpatched) patch of each module; every patch
then sets exactly what Triton's own would set."""

from __future__ import annotations

import inspect


def install():
    import triton.language as tl
    from triton.runtime import interpreter

    names: dict[int, list[str]] = {}

    def patch_builtin(pkg, builder, scope):
        if id(pkg) not in names:
            names[id(pkg)] = [n for n, m in inspect.getmembers(pkg) if tl.core.is_builtin(m)]
        for name in names[id(pkg)]:
            member = getattr(pkg, name)
            if tl.core.is_builtin(member):  # not already patched by an enclosing call
                interpreter._patch_attr(pkg, name, member, builder, scope)

    interpreter._patch_builtin = patch_builtin
