"""The backend registry: plugins from the ``tileinfer`` entry-point group, resolved into op tables.

Each backend distribution declares one entry point in the group ``tileinfer`` whose name is the
backend's name and whose value is a module (or object) with ``@hookimpl`` functions. Set
``TILEINFER_BACKENDS=ref,triton`` to load only those plugins (``ref`` is always loaded: it is the
fallback for every op); a name there that no installed plugin has is reported (a
``BackendWarning``, and a line of ``tileinfer backends``).

A plugin is checked when it is loaded, and one that fails a check is kept as an *invalid* backend
(listed with the reason, never chosen) while the others load normally:

- every ``@hookimpl`` must be named after an op of ``hookspecs`` (a misspelled ``rms_norm`` is an
  error, not a silently unused function) and take the spec's arguments, same names, same order
  (the op table calls ops positionally);
- ``tileinfer_backend_info()`` must return a well-formed ``BackendInfo``; an exception or another
  value (None, ...) makes the plugin invalid;
- the info's name must equal the entry point's name, and no two plugins may claim one name: an
  entry point can never replace an installed backend (``ref``, ...).

The hot path never calls ``pm.hook.<op>()``: ``get_backend(name)`` resolves every op once into an
``OpTable`` of plain callables, the chosen backend's implementation or else the ref backend's.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import threading
import warnings
from dataclasses import replace

import pluggy

from . import hookspecs
from .backends import Backend, BackendError, BackendInfo, BackendWarning, OpTable
from .entry_points import (ENTRY_POINT_GROUP, entry_points_by_name, is_own, own_entry_point,
                           where_from)

ALLOW_ENV = "TILEINFER_BACKENDS"
FALLBACK = "ref"
INFO_HOOK = "tileinfer_backend_info"

# Every op name, in the order of the hookspecs.
OP_NAMES = tuple(
    name for name in vars(hookspecs)
    if callable(getattr(hookspecs, name)) and hasattr(getattr(hookspecs, name), "tileinfer_spec")
    and name != INFO_HOOK
)
# Ops a backend may leave out without a fallback: the model then calls the ops they fuse.
OPTIONAL_OPS = ("attention_with_inputs", "sample_per_row", "sample_tokens_with_sums",
                "gemma_rmsnorm", "add_gemma_rmsnorm", "add_rmsnorm_e4m3", "linear_e4m3_input",
                "linear_swiglu_e4m3_input")

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
    pm.add_hookspecs(hookspecs)
    return pm


def _allowed_names() -> set[str] | None:
    raw = os.environ.get(ALLOW_ENV, "").strip()
    if not raw:
        return None
    return {n.strip() for n in raw.split(",") if n.strip()} | {FALLBACK}


def _parameters(fn) -> tuple[str, ...] | None:
    """The argument names of fn (``self`` of a method excluded), or None if it takes *args or
    **kwargs (which the positional call of the op table cannot check)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    return tuple(p.name for p in params)


SPEC_ARGS = {name: _parameters(getattr(hookspecs, name)) for name in (INFO_HOOK,) + OP_NAMES}


def _hookimpls(pm: pluggy.PluginManager, plugin) -> dict[str, object]:
    """hook name -> function of every ``@hookimpl`` of plugin, checked against the hookspecs.
    Raises BackendError naming the op for an unknown name or a different argument list."""
    found = {}
    for attr in dir(plugin):
        try:
            opts = pm.parse_hookimpl_opts(plugin, attr)
        except Exception:  # an attribute that raises on access is not a hookimpl
            continue
        if opts is None:
            continue
        hook = opts.get("specname") or attr
        fn = getattr(plugin, attr)
        if hook not in SPEC_ARGS:
            close = difflib.get_close_matches(hook, SPEC_ARGS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise BackendError(f"{hook!r} is not an op of the contract{hint}; the ops are "
                               "listed in tileinfer/backend/hookspecs.py")
        if hook in found:
            raise BackendError(f"op {hook!r} is implemented twice")
        args, spec = _parameters(fn), SPEC_ARGS[hook]
        if args != spec:
            got = "*args/**kwargs" if args is None else ", ".join(args)
            raise BackendError(f"op {hook!r} takes ({got}); the spec is ({', '.join(spec)}): "
                               "same names, same order")
        found[hook] = fn
    return found


def _checked_info(info) -> BackendInfo:
    """info if it is a well-formed BackendInfo (devices made a tuple), else a BackendError."""
    if not isinstance(info, BackendInfo):
        raise BackendError(f"{INFO_HOOK}() returned {info!r}, not a tileinfer.backend.BackendInfo")
    problems = []
    if not isinstance(info.name, str) or not _NAME_RE.fullmatch(info.name):
        problems.append(f"name {info.name!r} is not a name (letters, digits, '_', '.', '-')")
    if not isinstance(info.available, bool):
        problems.append(f"available is {info.available!r}, not a bool")
    if not isinstance(info.reason, str):
        problems.append(f"reason is {info.reason!r}, not a str")
    devices = info.devices
    if (not isinstance(devices, (tuple, list)) or not devices
            or not all(isinstance(d, str) and d for d in devices)):
        problems.append(f"devices is {devices!r}, not a non-empty tuple of device types")
    for flag in ("graph_safe", "batch_invariant"):
        if not isinstance(getattr(info, flag), bool):
            problems.append(f"{flag} is {getattr(info, flag)!r}, not a bool")
    if not isinstance(info.notes, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in info.notes.items()):
        problems.append("notes is not a dict of str to str")
    if problems:
        raise BackendError(f"{INFO_HOOK}() returned a bad BackendInfo: {'; '.join(problems)}")
    return replace(info, devices=tuple(devices))


class Registry:
    """All backends known to this process, loaded from entry points on first use.

    ``backends``: name -> Backend (valid or invalid); ``rejected``: plugins refused because their
    name was taken, listed but never chosen; ``unknown_allowed``: names in TILEINFER_BACKENDS
    that no installed entry point has.
    """

    def __init__(self):
        self.pm = _new_plugin_manager()
        self.backends: dict[str, Backend] = {}
        self.rejected: list[Backend] = []
        self.unknown_allowed: list[str] = []
        self._tables: dict[str, OpTable] = {}
        self._from_entry_points: set[str] = set()
        self._lock = threading.RLock()
        self._loaded = False  # every entry point imported
        self._imported: set[str] = set()  # names whose entry points were imported
        self._own: set[str] = set()  # names imported from our own distribution before a scan
        self._by_name = self._allowed = None

    def load_entry_points(self, names=None):
        """Import the installed backends' plugins: all of them, or only those of ``names``
        (choosing one backend imports it and ref, not every other backend's kernels).

        A name of our own (``tileinfer-backend-NAME`` is installed) loads from its distribution
        without reading the entry points of every installed distribution, which takes a new
        process tens of milliseconds on an image with hundreds of packages: ours keeps its name
        whoever else claims it (``_load_entry_point``), and the other claimants are listed as
        rejected once the group is read in full (``listed``, an unknown name)."""
        with self._lock:
            if self._loaded:
                return
            if names is not None and self._by_name is None:
                names = [name for name in names if not self._load_own(name)]
                if not names:
                    return
            if self._by_name is None:
                self._allowed = _allowed_names()
                self._by_name = entry_points_by_name()
                for name in sorted(self._own):
                    own = [ep for ep in self._by_name.get(name, ()) if is_own(ep, name)]
                    self._reject_others(name, self._by_name.get(name, ()), own[:1])
                if self._allowed is not None:
                    self.unknown_allowed = sorted(self._allowed - set(self._by_name))
                    if self.unknown_allowed:
                        warnings.warn(
                            f"{ALLOW_ENV} names backends that are not installed: "
                            f"{', '.join(self.unknown_allowed)} (installed: "
                            f"{', '.join(sorted(self._by_name)) or 'none'})", BackendWarning,
                            stacklevel=3)
            todo = sorted(self._by_name) if names is None else names
            for name in todo:
                if name in self._imported or name not in self._by_name:
                    continue
                self._imported.add(name)
                if self._allowed is None or name in self._allowed:
                    self._load_entry_point(name, self._by_name[name])
            if names is None:
                self._loaded = True

    def _load_own(self, name: str) -> bool:
        """Import backend ``name`` from our own distribution, if it is installed and allowed
        (see ``load_entry_points``); whether the name is settled."""
        if name in self._imported:
            return True
        allowed = _allowed_names()
        if allowed is not None and name not in allowed:
            return False
        ep = own_entry_point(name)
        if ep is None:
            return False
        self._imported.add(name)
        self._own.add(name)
        self._load_entry_point(name, [ep])
        return True

    def _reject_others(self, name, eps, kept):
        """List every claimant of ``name`` but those in ``kept`` as invalid plugins."""
        if len(eps) < 2:
            return
        claimants = ", ".join(where_from(ep) for ep in eps)
        for ep in eps:
            if not any(ep is k for k in kept):
                self.rejected.append(Backend(
                    name, None, None, source=where_from(ep),
                    error=f"invalid plugin: backend name {name!r} is claimed by several "
                          f"entry points ({claimants}); uninstall all but one"))

    def _load_entry_point(self, name, eps):
        if len(eps) > 1:
            # Two distributions claim one name: ours (tileinfer-backend-NAME) keeps it, else
            # neither can be chosen; the others are listed as invalid.
            own = [ep for ep in eps if is_own(ep, name)]
            winner = own[0] if len(own) == 1 else None
            self._reject_others(name, eps, [winner])
            if winner is None:
                claimants = ", ".join(where_from(ep) for ep in eps)
                self.backends[name] = Backend(
                    name, None, None, source=claimants,
                    error=f"invalid plugin: backend name {name!r} is claimed by several entry "
                          f"points ({claimants}); uninstall all but one")
                return
            eps = [winner]
        ep = eps[0]
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken plugin must not break the others
            self.backends[name] = Backend(name, None, None, source=where_from(ep),
                                          error=f"failed to import {ep.value}: {exc!r}")
            return
        self._register_locked(plugin, name, source=where_from(ep), entry_point=True)

    def register(self, plugin, name: str | None = None) -> Backend:
        """Register a backend plugin object directly (tests, notebooks). It may replace a plugin
        registered this way under the same name, never an installed (entry-point) backend."""
        self.load_entry_points()
        with self._lock:
            return self._register_locked(plugin, name)

    def unregister(self, name: str):
        with self._lock:
            backend = self.backends.pop(name, None)
            self._tables.pop(name, None)
            self._from_entry_points.discard(name)
            if backend is not None and backend.plugin is not None \
                    and self.pm.is_registered(backend.plugin):
                self.pm.unregister(backend.plugin)

    def _register_locked(self, plugin, name=None, source="", entry_point=False):
        label = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        try:
            impls = _hookimpls(self.pm, plugin)
            info_fn = impls.pop(INFO_HOOK, None)
            if info_fn is None:
                raise BackendError(f"it has no {INFO_HOOK} hook")
            info = _checked_info(info_fn())
            if name is not None and info.name != name:
                raise BackendError(f"its {INFO_HOOK}() names backend {info.name!r}, not "
                                   f"{name!r}: the entry point's name must equal "
                                   "BackendInfo.name")
        except Exception as exc:  # a bad plugin must not break the others
            message = str(exc) if isinstance(exc, BackendError) else \
                f"{INFO_HOOK}() raised {type(exc).__name__}: {exc}"
            backend = Backend(label, None, None, source=source,
                              error=f"invalid plugin {label!r}: {message}")
            if label in self._from_entry_points and not entry_point:
                self.rejected.append(backend)  # never shadow an installed backend
            else:
                self.backends[label] = backend
                self._tables.pop(label, None)
            return backend
        name = info.name
        if name in self._from_entry_points or (entry_point and name in self.backends):
            backend = Backend(name, None, None, source=source,
                              error=f"invalid plugin {label!r}: backend {name!r} is already "
                                    f"installed ({self.backends[name].source or 'registered'})")
            self.rejected.append(backend)
            return backend
        old = self.backends.get(name)
        if old is not None and old.plugin is not None and self.pm.is_registered(old.plugin):
            self.pm.unregister(old.plugin)  # a direct re-registration replaces the old one
        try:  # pluggy's own checks (hookimpl options); ours above are stricter
            self.pm.register(plugin, name=f"{name}@{id(plugin)}")
        except Exception as exc:
            backend = Backend(name, None, None, source=source,
                              error=f"invalid plugin {label!r}: {exc}")
            self.backends[name] = backend
            return backend
        backend = Backend(name, info, plugin, impls, source=source)
        self.backends[name] = backend
        if entry_point:
            self._from_entry_points.add(name)
        self._tables.pop(name, None)
        return backend

    def get(self, name: str) -> OpTable:
        if name in self._tables:
            return self._tables[name]
        self.load_entry_points([name, FALLBACK])
        backend = self.backends.get(name)
        if backend is None:
            self.load_entry_points()  # the error lists every installed backend
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

    def listed(self) -> list[Backend]:
        """Every backend found, valid or not, the rejected plugins, and a line for each name in
        TILEINFER_BACKENDS that is not installed."""
        self.load_entry_points()
        with self._lock:
            found = sorted(self.backends.values(), key=lambda b: (b.name != FALLBACK, b.name))
            missing = [Backend(n, None, None, error=f"not installed (named in {ALLOW_ENV})")
                       for n in self.unknown_allowed]
            return found + list(self.rejected) + missing


_registry = Registry()


def registry() -> Registry:
    return _registry


def get_backend(name: str = FALLBACK) -> OpTable:
    """The op table of backend ``name``; a clear ``BackendError`` if it is unknown or cannot run."""
    if isinstance(name, OpTable):
        return name
    return _registry.get(name)


def list_backends() -> list[Backend]:
    """Every backend found, available or not, with its reason and the ops it implements; then
    the invalid plugins that were rejected and the names of TILEINFER_BACKENDS not installed."""
    return _registry.listed()


def default_backend_name() -> str:
    """The backend used when none is named: triton, then cuda (on a GPU), else ref.

    Triton comes first: it needs no NVRTC and runs on any GPU Triton supports; cuda (faster on
    Hopper, see benchmarks/RESULTS.md) is chosen by name."""
    for name in ("triton", "cuda"):
        _registry.load_entry_points([name])
        b = _registry.backends.get(name)
        if b is not None and b.available and "cuda" in b.info.devices:
            return name
    return FALLBACK
