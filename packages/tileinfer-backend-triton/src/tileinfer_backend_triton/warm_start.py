"""The kernels a process launched, loaded again by the next process before its first launch.

At the first launch of each kernel a new process pays for Triton's search of its on-disk cache:
a hash of the kernel's source and of everything it calls (a walk of their syntax trees), the
cache key, and the compiled kernel's files read back; one answer of ``tileinfer run`` launches
twenty-odd kernels, and these searches were a visible part of its start on Triton
(benchmarks/RESULTS.md, 2026-12-03, "where a new process's start-up goes"). Triton hands each
kernel it compiles or finds to ``knobs.runtime.jit_post_compile_hook`` with its specialization
as JSON, and ``JITFunction.preload`` makes the kernel from that JSON without a launch.

Here the hook records the specializations of this package's kernels that a launch had to find,
and at exit a process that met such new ones stores ``KEPT`` at most in TileInfer's home: the
new ones, then the preloaded ones it launched, then the rest of the store (so the kernels of
recent processes come first), under a fingerprint of Triton's installation
(``triton_key.fingerprint``), this package's sources and the GPU's compute capability. The
thread that installs Triton's cache key at load then preloads the stored ones while the model's
weights load; the first launch stops it (``stop`` lets the kernel in hand finish), so a process
never waits for kernels it may not launch. A
specialization that fails to preload is skipped: its kernel is found at its first launch, as
without this. ``TILEINFER_TRITON_WARM_START=0`` turns it off.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import threading
from pathlib import Path

from .triton_key import files_fingerprint, write_store

STORE = "triton-kernels.json"  # in TileInfer's home: {"fingerprint": ..., "kernels": [...]}
KEPT = 96  # specializations stored, the latest first
ENV = "TILEINFER_TRITON_WARM_START"

_seen: dict = {}  # (module, qualname, specialization JSON) -> None: launches found them
_stored: list = []  # what the store held when this process read it ([module, qualname, JSON])
_preloaded: dict = {}  # (module, qualname, JSON) -> the kernel preload made
_stop = threading.Event()


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def package_fingerprint(package_root: Path, extra: str) -> str:
    """A hash of ``extra`` (Triton's fingerprint, the GPU) and each source file's path, size and
    modification time under package_root."""
    return files_fingerprint(package_root, sorted(package_root.rglob("*.py")), extra)


def record(**hook_args):
    """The jit_post_compile_hook: remember a kernel of this package that a launch had to find
    (module, qualname, its specialization); not one that preload (a warm-up) made."""
    fn, compiled = hook_args.get("fn"), hook_args.get("compile") or {}
    module = str(getattr(fn, "module", ""))
    data = compiled.get("specialization_data")
    if hook_args.get("is_manual_warmup") or not isinstance(data, str):
        return
    if module.startswith(__package__ + "."):
        _seen[(module, str(fn.name), data)] = None


def install_hook(before_launch_compile=None):
    """Record this package's kernels from now on, after any hook installed before; and call
    ``before_launch_compile()`` before Triton looks for a kernel for a launch (its
    jit_cache_hook, not for a preload), so that the preloading thread stops before a launch
    of any path, not only a model's, makes kernels beside it."""
    from triton import knobs

    previous = knobs.runtime.jit_post_compile_hook
    previous_cache = knobs.runtime.jit_cache_hook

    def hook(**hook_args):
        record(**hook_args)
        return previous(**hook_args) if previous is not None else None

    def cache_hook(**hook_args):
        if before_launch_compile is not None and not hook_args.get("is_manual_warmup"):
            before_launch_compile()
        return previous_cache(**hook_args) if previous_cache is not None else None

    knobs.runtime.jit_post_compile_hook = hook
    knobs.runtime.jit_cache_hook = cache_hook


def read(store: Path, fingerprint: str) -> list:
    """The stored specializations ([module, qualname, JSON] each) if the store's fingerprint is
    this one, else none."""
    try:
        stored = json.loads(store.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(stored, dict) or stored.get("fingerprint") != fingerprint:
        return []
    kernels = stored.get("kernels")
    return [k for k in kernels if isinstance(k, list) and len(k) == 3
            and all(isinstance(x, str) for x in k)] if isinstance(kernels, list) else []


def resolve(module: str, qualname: str):
    """This package's function of that module and qualified name, or None."""
    if not module.startswith(__package__ + "."):
        return None
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return obj


def preload(kernels: list, find=resolve) -> int:
    """Preload each stored specialization (until ``stop``); how many were made."""
    made = 0
    for module, qualname, data in kernels:
        if _stop.is_set():
            break
        fn = find(module, qualname)
        if fn is None or not callable(getattr(fn, "preload", None)):
            continue
        try:
            _preloaded[(module, qualname, data)] = fn.preload(data)
            made += 1
        except Exception:  # noqa: BLE001 - this kernel is then found at its first launch
            continue
    return made


def stop():
    """The first launch is near: preload nothing more."""
    _stop.set()


def save(store: Path, fingerprint: str):
    """Store the specializations this process's launches found, then the preloaded ones it
    launched (their kernels were loaded), then the rest of the store, KEPT at most; nothing
    when its launches found none that was not stored."""
    new = [list(k) for k in _seen if list(k) not in _stored]
    if not new:
        return
    launched = [list(k) for k, kernel in _preloaded.items()
                if getattr(kernel, "module", None) is not None]
    kernels = new + [k for k in launched if k not in new]
    kernels += [k for k in _stored if k not in kernels]
    write_store(store, {"fingerprint": fingerprint, "kernels": kernels[:KEPT]})


def start(triton_fingerprint: str):
    """In the thread that installed Triton's key: preload the stored specializations of this
    installation, package and GPU, and store this process's at exit."""
    import torch

    from tileinfer.io.paths import tileinfer_home

    capability = ".".join(map(str, torch.cuda.get_device_capability()))
    fingerprint = package_fingerprint(Path(__file__).parent,
                                      f"{triton_fingerprint} sm{capability}")
    store = tileinfer_home() / STORE
    _stored[:] = read(store, fingerprint)
    atexit.register(save, store, fingerprint)
    preload(_stored)
