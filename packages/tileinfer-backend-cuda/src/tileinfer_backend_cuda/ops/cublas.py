"""bf16 products on cuBLAS through torch.mm: batched decode steps (up to
tuning.cublaslt_max_tokens() rows) on cuBLASLt, prefill on PyTorch's default library."""

from __future__ import annotations

import os
import sys

import torch

from .tuning import cublaslt_max_tokens

# cuBLAS bf16 x bf16 -> float32 outputs (torch.mm's out_dtype form, PyTorch 2.8 and newer): the
# logits of steps past the GEMVs (linear.py) and INT8 prefill's sums (int8_cublas.py).
MM_FLOAT32_OUT = hasattr(torch.ops.aten.mm, "dtype_out")


def _prefer_cublaslt():
    """Make cuBLASLt PyTorch's preferred BLAS library. PyTorch's C++ side prints, once a process,
    that the setting is experimental (a note for programs that set it for good) straight to file
    descriptor 2; here it lasts one product, so the first setting runs with that descriptor on
    os.devnull and the user's output stays clean."""
    global _cublaslt_noted
    if _cublaslt_noted:
        torch.backends.cuda.preferred_blas_library("cublaslt")
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        torch.backends.cuda.preferred_blas_library("cublaslt")
        _cublaslt_noted = True
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


_cublaslt_noted = False


def cublas(out, x, weight, **mm_options):
    """out = x @ W.T by torch.mm; products of up to tuning.cublaslt_max_tokens() rows on
    cuBLASLt (PyTorch's preferred BLAS library, set for the call and restored: a process-wide
    setting, read when the product launches or is captured)."""
    if x.shape[0] > cublaslt_max_tokens():
        torch.mm(x, weight.t(), out=out, **mm_options)
        return
    before = torch.backends.cuda.preferred_blas_library()
    _prefer_cublaslt()
    try:
        torch.mm(x, weight.t(), out=out, **mm_options)
    finally:
        torch.backends.cuda.preferred_blas_library(before)


_READY: set[int] = set()  # devices whose cuBLAS and cuBLASLt handles are made


def make_handles(device):
    """Make cuBLAS's and cuBLASLt's handles and workspaces on ``device`` now, with one tiny
    product on each library. cuBLAS makes them, and loads its libraries, at a process's first
    product (benchmarks/RESULTS.md, 2026-12-03, "where a new process's start-up goes"), which
    would otherwise fall in a model's first prefill
    past the GEMVs' rows: the first answer's time to its first token. Skipped inside a graph
    capture (it allocates)."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index in _READY or torch.cuda.is_current_stream_capturing():
        return
    cuda = torch.device("cuda", index)
    x = torch.zeros(2, 64, dtype=torch.bfloat16, device=cuda)
    w = torch.zeros(64, 64, dtype=torch.bfloat16, device=cuda)
    out = torch.empty(2, 64, dtype=torch.bfloat16, device=cuda)
    cublas(out, x, w)  # cuBLASLt: rows up to tuning.cublaslt_max_tokens()
    torch.mm(x, w.t(), out=out)  # the default library: longer prefills
    _READY.add(index)
