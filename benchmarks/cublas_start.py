"""What cuBLAS's first use costs a new process, and whether a thread can pay it while torch imports.

A new `tileinfer run` on cuda spends part of its warm-up in the first bf16 prefill GEMM
(cuBLAS through torch.mm). torch holds the interpreter's lock through its calls, so a thread
cannot overlap that with the main thread's work; a thread calling the cuBLAS library through
ctypes lets the lock go during each call. Each mode runs in new processes:

- ``base``: import torch, make the CUDA context, then time the first ``torch.mm`` (bf16,
  ROWS x K times K x N, as a short prompt's prefill of a small model).
- ``create``: a thread started before ``import torch`` makes the primary context
  (``tileinfer_cli/cuda_start.py``'s driver calls) and a cuBLAS and a cuBLASLt handle through
  ctypes.
- ``gemm``: the context and cuda_start's one ``cublasGemmEx``, of the timed product's shape.
- ``gemm_other``: cuda_start's thread as `tileinfer run -b cuda` starts it (its GEMM 16 x 64
  times 64 x 128, another shape).

Printed: each mode's median first ``torch.mm`` (milliseconds), its range, the thread's own time,
and the time from the process's start to the end of the first mm.

    python3 benchmarks/cublas_start.py [--processes 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

ROWS, K, N = 38, 576, 1536

CHILD = r"""
import ctypes, json, sys, threading, time
mode, rows, k, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t_start = time.perf_counter()
info = {}
from tileinfer_cli import cuda_start  # ctypes only: no torch

def warm():
    t0 = time.perf_counter()
    if mode == "gemm_other":  # the start-up thread as `tileinfer run -b cuda` starts it
        cuda_start._start_cuda(warm_cublas=True)
        info["thread_s"] = time.perf_counter() - t0
        return
    driver, context = cuda_start.primary_context()
    info["ctx_s"] = time.perf_counter() - t0
    cublas = cuda_start.cublas_library()
    assert driver.cuCtxSetCurrent(context) == 0
    if mode == "create":  # cuBLAS's and cuBLASLt's handles (libcublasLt: beside libcublas)
        lt = ctypes.CDLL(cublas._name.replace("libcublas.so", "libcublasLt.so"))
        h, hlt = ctypes.c_void_p(), ctypes.c_void_p()
        info["create_rc"] = (cublas.cublasCreate_v2(ctypes.byref(h)),
                             lt.cublasLtCreate(ctypes.byref(hlt)))
    else:  # "gemm": the timed torch.mm's shape
        cuda_start.first_gemm(driver, cublas, rows, k, n)
    info["thread_s"] = time.perf_counter() - t0

thread = None
if mode != "base":
    thread = threading.Thread(target=warm, daemon=True)
    thread.start()
import torch
t_torch = time.perf_counter()
torch.cuda.init()
x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
if thread is not None:
    thread.join()
t0 = time.perf_counter()
y = torch.mm(x, w)
torch.cuda.synchronize()
t1 = time.perf_counter()
y2 = torch.mm(x, w)
torch.cuda.synchronize()
t2 = time.perf_counter()
info.update(mode=mode, import_torch_s=t_torch - t_start, first_mm_s=t1 - t0,
            second_mm_s=t2 - t1, to_first_mm_end_s=t1 - t_start)
print(json.dumps(info))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--modes", default="base,create,gemm,gemm_other")
    args = parser.parse_args()
    results = {mode: [] for mode in args.modes.split(",")}
    for _ in range(args.processes):
        for mode in results:  # alternating, so that a drift of the machine weighs on all alike
            done = subprocess.run([sys.executable, "-c", CHILD, mode, str(ROWS), str(K), str(N)],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                print(f"{mode}: failed: {done.stderr.strip()[-400:]}", file=sys.stderr)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            results[mode].append(row)
            print(json.dumps(row))
    for mode, rows in results.items():
        if not rows:
            continue
        first = [r["first_mm_s"] * 1e3 for r in rows]
        thread = [r.get("thread_s", 0.0) * 1e3 for r in rows]
        total = [r["to_first_mm_end_s"] * 1e3 for r in rows]
        print(f"{mode}: first torch.mm median {statistics.median(first):.1f} ms "
              f"({min(first):.1f}-{max(first):.1f}); thread {statistics.median(thread):.1f} ms; "
              f"start to the first mm's end {statistics.median(total):.0f} ms", file=sys.stderr)


if __name__ == "__main__":
    main()
