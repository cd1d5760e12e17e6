"""Start the CUDA driver and the GPU's primary context in a thread while torch is imported.

A new process on a GPU spends a visible part of its start in ``cuInit`` and in making the
device's primary context (benchmarks/RESULTS.md, 2026-12-03, "where a new process's start-up
goes"); torch does both at its first CUDA call, after its own import. Both are plain driver
calls, and ctypes lets go of the interpreter's lock during a foreign call, so a thread can make
them while the main thread imports torch, which takes longer. torch's runtime then finds the
primary context made and uses it (the runtime API always runs on the primary context).

For the cuda backend the thread also runs one small cuBLAS GEMM: the first GEMM of a process
sets cuBLAS up, whatever its shape, and that would otherwise land in the warm-up's prefill
(torch holds the interpreter's lock through its calls, so only a foreign call can overlap it;
benchmarks/cublas_start.py, RESULTS.md 2026-12-06 (night)). The library is the one torch links,
found in the ``nvidia`` wheels beside torch's package, so that torch finds it loaded (by its
soname).
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import threading

# cuBLAS's enums: CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT, CUBLAS_OP_N
BF16, COMPUTE_32F, GEMM_DEFAULT, OP_N = 14, 68, -1, 0
# The start-up GEMM's shape: C (M x N) = A (M x K) B (K x N), bf16; small, any shape does.
M, K, N = 16, 64, 128


def start_cuda_in_background(backend: str | None) -> None:
    """Start the thread, unless the backend named runs on the CPU (``ref``) or the process
    cannot reach a CUDA driver (the thread then ends without a word)."""
    if backend == "ref" or os.environ.get("TRITON_INTERPRET") == "1":
        return
    threading.Thread(target=_start_cuda, args=(backend == "cuda",), name="tileinfer-cuda-start",
                     daemon=True).start()


def _start_cuda(warm_cublas: bool = False) -> None:
    started = primary_context()
    if started is None or not warm_cublas:
        return
    driver, context = started
    cublas = cublas_library()
    if cublas is not None and driver.cuCtxSetCurrent(context) == 0:
        first_gemm(driver, cublas)


def primary_context():
    """(the driver library, device 0's primary context) once the driver is initialized and the
    context retained; None where a call fails or no driver is found."""
    # What torch sets before its own cuInit: kernels load when first launched, not all at once.
    os.environ.setdefault("CUDA_MODULE_LOADING", "LAZY")
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, context = ctypes.c_int(), ctypes.c_void_p()
    if driver.cuInit(0) != 0 or driver.cuDeviceGet(ctypes.byref(device), 0) != 0:
        return None
    if driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) != 0:
        return None
    return driver, context


def cublas_library():
    """libcublas from the ``nvidia`` wheels beside torch's package (the library torch links), or
    None."""
    site = torch_site()
    if site is None:
        return None
    for pattern in ("nvidia/*/lib/libcublas.so.*", "nvidia/lib/libcublas.so.*"):
        for path in sorted(glob.glob(os.path.join(site, pattern))):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


def torch_site() -> str | None:
    """The folder that holds torch's package, found without importing it (the main thread may
    be importing it meanwhile: its spec is then read from sys.modules)."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.dirname(spec.origin))


def first_gemm(driver, cublas, m: int = M, k: int = K, n: int = N) -> None:
    """One bf16 GEMM of m x k by k x n on buffers of the thread's own (freed after), on the
    default stream; any failing call ends it quietly (torch then sets cuBLAS up itself). The
    handle is kept for the process's life, as where the set-up was measured."""
    handle = ctypes.c_void_p()
    if cublas.cublasCreate_v2(ctypes.byref(handle)) != 0:
        return
    buffers = []
    try:
        for size in (m * k * 2, k * n * 2, m * n * 2):
            pointer = ctypes.c_uint64()
            if driver.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)) != 0:
                return
            buffers.append(pointer)
        a, b, c = (ctypes.c_void_p(p.value) for p in buffers)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        # column-major: C^T (N x M) = B^T (N x K) A^T (K x M), the row-major C = A B
        cublas.cublasGemmEx(handle, OP_N, OP_N, n, m, k, ctypes.byref(alpha), b, BF16, n, a,
                            BF16, k, ctypes.byref(beta), c, BF16, n, COMPUTE_32F, GEMM_DEFAULT)
        driver.cuCtxSynchronize()
    finally:
        for pointer in buffers:
            driver.cuMemFree_v2(pointer)
