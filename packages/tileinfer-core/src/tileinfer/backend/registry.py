"""The backend registry: plugins from the ``tileinfer`` entry-point group, resolved into op tables.

Each backend distribution declares one entry point in the group ``tileinfer`` whose name is the
backend's name and whose value is a module (or object) with ``@hookimpl`` functions. Set
``TILEINFER_BACKENDS=ref,triton`` to load only those plugins (``ref`` is always loaded: it is the
fallback for every op).

The hot path never calls ``pm.hook.<op>()``: ``get_backend(name)`` resolves every op once into an
``OpTable`` of plain callables, the chosen backend's implementation or else the ref backend's.
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from dataclasses import dataclass, field

import pluggy

from . import hookspecs

ENTRY_POINT_GROUP = "tileinfer"
ALLOW_ENV = "TILEINFER_BACKENDS"
FALLBACK = "ref"

# Every op name, in the order of the hookspecs.
OP_NAMES = tuple(
    name for name in vars(hookspecs)
    if callable(getattr(hookspecs, name)) and hasattr(getattr(hookspecs, name), "tileinfer_spec")
    and name != "tileinfer_backend_info"
)
# Ops a backend may leave out without a fallback: the model then calls the ops they fuse.
OPTIONAL_OPS = ("attention_with_inputs",)


class BackendError(RuntimeError):
    """A backend that is unknown, failed to load, or cannot run on this machine."""


@dataclass(frozen=True)
class BackendInfo:
    """What a backend says about itself.

    name: the backend's name (also its entry point's name). available: whether it can run here;
    reason: why not. devices: the torch device types it runs on ("cuda", "cpu").
    graph_safe: whether its ops can be captured in CUDA graphs (allocate nothing, never sync).
    notes: per-op remarks shown by ``tileinfer backends`` (e.g. "prefill GEMM uses cuBLAS").
    """

    name: str
    available: bool
    reason: str = ""
    devices: tuple[str, ...] = ("cuda",)
    graph_safe: bool = True
    notes: dict = field(default_factory=dict)


@dataclass
class Backend:
    """A loaded plugin: its info and the ops it implements itself."""

    name: str
    info: BackendInfo | None
    plugin: object | None
    implemented: dict = field(default_factory=dict)  # op name -> callable
    error: str = ""  # why the plugin failed to load

    @property
    def available(self) -> bool:
        return self.info is not None and self.info.available

    @property
    def reason(self) -> str:
        if self.error:
            return self.error
        return self.info.reason if self.info else "no backend info"


class OpTable:
    """The resolved ops of one backend: ``table.linear(out, x, w, scale)`` calls a plain function.

    ``fallbacks`` lists the ops taken from the ref backend because the chosen one lacks them. An
    optional op the backend lacks is None.
    """

    def __init__(self, backend: Backend, ops: dict, fallbacks: tuple[str, ...]):
        self.backend = backend
        self.name = backend.name
        self.fallbacks = fallbacks
        self.graph_safe = backend.info.graph_safe if backend.info else False
        self._ops = ops
        for op, fn in ops.items():
            setattr(self, op, fn)

    def __repr__(self):
        return f"OpTable({self.name!r}, fallbacks={list(self.fallbacks)})"


def _new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    return pm


def _allowed_names() -> set[str] | None:
    raw = os.environ.get(ALLOW_ENV, "").strip()
    if not raw:
        return None
    return {n.strip() for n in raw.split(",") if n.strip()} | {FALLBACK}


class Registry:
    """All backends known to this process, loaded from entry points on first use."""

    def __init__(self):
        self.pm = _new_plugin_manager()
        self.backends: dict[str, Backend] = {}
        self._tables: dict[str, OpTable] = {}
        self._lock = threading.Lock()
        self._loaded = False

    def load_entry_points(self):
        with self._lock:
            if self._loaded:
                return
            self._loaded = True
            allowed = _allowed_names()
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                if ep.name in self.backends or (allowed is not None and ep.name not in allowed):
                    continue
                try:
                    plugin = ep.load()
                except Exception as exc:  # a broken plugin must not break the others
                    self.backends[ep.name] = Backend(
                        ep.name, None, None, error=f"failed to import {ep.value}: {exc!r}")
                    continue
                self._register_locked(plugin, ep.name)

    def register(self, plugin, name: str | None = None) -> Backend:
        """Register a backend plugin object directly (tests, notebooks)."""
        self.load_entry_points()
        with self._lock:
            return self._register_locked(plugin, name)

    def unregister(self, name: str):
        with self._lock:
            backend = self.backends.pop(name, None)
            self._tables.pop(name, None)
            if backend is not None and backend.plugin is not None:
                self.pm.unregister(backend.plugin)

    def _register_locked(self, plugin, name):
        try:
            self.pm.register(plugin, name=name)  # validates argument names against the specs
            impls = {
                op: impl.function
                for op in ("tileinfer_backend_info",) + OP_NAMES
                for impl in getattr(self.pm.hook, op).get_hookimpls()
                if impl.plugin is plugin
            }
            info_fn = impls.pop("tileinfer_backend_info", None)
            if info_fn is None:
                raise BackendError("it has no tileinfer_backend_info hook")
            info = info_fn()
        except Exception as exc:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            backend = Backend(name or repr(plugin), None, None, error=f"invalid plugin: {exc}")
            self.backends[backend.name] = backend
            return backend
        backend = Backend(info.name, info, plugin, impls)
        self.backends[info.name] = backend
        self._tables.pop(info.name, None)
        return backend

    def get(self, name: str) -> OpTable:
        self.load_entry_points()
        if name in self._tables:
            return self._tables[name]
        backend = self.backends.get(name)
        if backend is None:
            known = ", ".join(sorted(self.backends)) or "none"
            hint = f" ({ALLOW_ENV} is set)" if os.environ.get(ALLOW_ENV) else ""
            raise BackendError(f"unknown backend {name!r}{hint}; installed backends: {known}")
        if not backend.available:
            raise BackendError(f"backend {name!r} cannot run here: {backend.reason}")
        fallback = self.backends.get(FALLBACK)
        if name != FALLBACK and (fallback is None or not fallback.available):
            raise BackendError("the ref backend (tileinfer-backend-ref) is not installed; "
                               "it provides every op a backend lacks")
        ops, fallbacks = {}, []
        for op in OP_NAMES:
            fn = backend.implemented.get(op)
            if fn is None and op in OPTIONAL_OPS:
                ops[op] = None
                continue
            if fn is None:
                if fallback is None or op not in fallback.implemented:
                    raise BackendError(f"op {op!r} has no implementation in {name!r} or ref")
                fn = fallback.implemented[op]
                fallbacks.append(op)
            ops[op] = fn
        table = OpTable(backend, ops, tuple(fallbacks))
        self._tables[name] = table
        return table


_registry = Registry()


def registry() -> Registry:
    return _registry


def get_backend(name: str = FALLBACK) -> OpTable:
    """The op table of backend ``name``; a clear ``BackendError`` if it is unknown or cannot run."""
    if isinstance(name, OpTable):
        return name
    return _registry.get(name)


def list_backends() -> list[Backend]:
    """Every backend found, available or not, with its reason and the ops it implements."""
    _registry.load_entry_points()
    return sorted(_registry.backends.values(), key=lambda b: (b.name != FALLBACK, b.name))


def default_backend_name() -> str:
    """The backend used when none is named: triton, then cuda (on a GPU), else ref.

    Triton comes first: it needs no NVRTC and runs on any GPU Triton supports; cuda (faster on
    Hopper, see benchmarks/RESULTS.md) is chosen by name."""
    _registry.load_entry_points()
    for name in ("triton", "cuda"):
        b = _registry.backends.get(name)
        if b is not None and b.available and "cuda" in b.info.devices:
            return name
    return FALLBACK
