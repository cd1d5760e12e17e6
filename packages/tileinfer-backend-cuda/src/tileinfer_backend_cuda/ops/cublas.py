"""bf16 products on cuBLAS through torch.mm: batched decode steps (up to
tuning.cublaslt_max_tokens() rows) on cuBLASLt, prefill on PyTorch's default library."""

from __future__ import annotations

import os
import sys

import torch

from .tuning import cublaslt_max_tokens


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
