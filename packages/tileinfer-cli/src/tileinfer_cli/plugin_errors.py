"""Naming the backend plugin and the op when an exception comes out of a plugin's op, so that a
failing plugin is one line (exit code 1) that says whose bug it is, not a traceback."""

from __future__ import annotations

import sys


def _op_codes() -> dict:
    """code object -> (backend name, op name) of every op implementation loaded."""
    from tileinfer.backend.registry import registry

    codes = {}
    for backend in list(registry().backends.values()):
        for op, fn in backend.implemented.items():
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if code is not None:
                codes.setdefault(code, (backend.name, op))
    return codes


def _chain(exc: BaseException):
    """exc and the exceptions it was raised from or while handling."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def failing_op(exc: BaseException) -> tuple[str, str] | None:
    """(backend, op) of the outermost op implementation in exc's traceback, or None when no op
    raised it (or no backend was ever loaded)."""
    if "tileinfer.backend.registry" not in sys.modules:
        return None
    codes = _op_codes()
    for link in _chain(exc):
        tb = link.__traceback__
        while tb is not None:
            hit = codes.get(tb.tb_frame.f_code)
            if hit is not None:
                return hit
            tb = tb.tb_next
    return None
