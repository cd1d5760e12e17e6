"""Helpers shared by the CUDA backend's GPU test files (test_cuda_gpu_*.py)."""

from __future__ import annotations

import torch
from tileinfer.backend.types import XIELUScalars
from tileinfer.testing.conformance import quantize_weight

DEV = "cuda"
XIELU = XIELUScalars(alpha_p=0.8, alpha_n=0.9, beta=0.5, eps=-1e-6)


def weight(rows, cols, g, int8, std=0.02):
    """A random (rows, cols) bf16 weight from generator g (on g's device), INT8-quantized per row
    when int8: (weight, scale or None) on the GPU."""
    w = (torch.randn(rows, cols, generator=g, device=g.device) * std).to(torch.bfloat16)
    if not int8:
        return w.to(DEV), None
    q, scale = quantize_weight(w)
    return q.to(DEV), scale.to(DEV)


def loaded_modules(file, **defines):
    """The loaded modules of a kernel file whose defines include ``defines``."""
    from tileinfer_backend_cuda import compiler

    return [m for m in compiler.loaded_modules()
            if m.file == file and all(m.defines.get(k) == v for k, v in defines.items())]
