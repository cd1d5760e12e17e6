"""Start the CUDA driver and the GPU's primary context in a thread while torch is imported.

A new process on a GPU spends a visible part of its start in ``cuInit`` and in making the
device's primary context (benchmarks/RESULTS.md, 2026-12-03, "where a new process's start-up
goes"); torch does both at its first CUDA call, after its own import. Both are plain driver
calls, and ctypes lets go of the interpreter's lock during a foreign call, so a thread can make
them while the main thread imports torch, which takes longer. torch's runtime then finds the
primary context made and uses it (the runtime API always runs on the primary context).
"""

from __future__ import annotations

import ctypes
import os
import threading


def start_cuda_in_background(backend: str | None) -> None:
    """Start the thread, unless the backend named runs on the CPU (``ref``) or the process
    cannot reach a CUDA driver (the thread then ends without a word)."""
    if backend == "ref" or os.environ.get("TRITON_INTERPRET") == "1":
        return
    threading.Thread(target=_start_cuda, name="tileinfer-cuda-start", daemon=True).start()


def _start_cuda() -> None:
    # What torch sets before its own cuInit: kernels load when first launched, not all at once.
    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    device, context = ctypes.c_int(), ctypes.c_void_p()
    if driver.cuInit(0) != 0 or driver.cuDeviceGet(ctypes.byref(device), 0) != 0:
        return
    driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
