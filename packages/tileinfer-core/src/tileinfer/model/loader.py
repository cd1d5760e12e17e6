"""Loading a model folder into a ``Model`` on a backend."""

from __future__ import annotations

import torch

from ..backend import OpTable, get_backend
from ..io.model_dir import resolve_model_dir
from .config import check_max_len, load_config
from .decoder import Model
from .weights import load_weights


def default_device(ops: OpTable) -> torch.device:
    """cuda when the backend runs there and a GPU is present, else its first device kind."""
    devices = ops.backend.info.devices
    if "cuda" in devices and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device(devices[0] if devices else "cpu")


def load_model(model=None, dtype: torch.dtype = torch.bfloat16, backend="ref", device=None,
               max_len: int = 4096, quantize: str | None = None) -> Model:
    """Load a model (anything ``resolve_model_dir`` takes: a folder, a pulled repo id, a .gguf
    file, or None for the embedded default model) to run on backend.

    dtype: the activation and weight dtype. device: default ``default_device``. max_len: the
    longest sequence (positions the RoPE tables cover). quantize: None, or "int8" for INT8
    weight-only linear layers (``tileinfer.model.quant``).
    """
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    ops = get_backend(backend)
    device = torch.device(device) if device is not None else default_device(ops)
    if device.type not in ops.backend.info.devices:
        raise ValueError(f"backend {ops.name!r} runs on {', '.join(ops.backend.info.devices)}, "
                         f"not {device.type}")
    model_dir = resolve_model_dir(model)
    config = load_config(model_dir)
    check_max_len(config, max_len)
    weights = load_weights(config, model_dir, dtype=dtype, device=device, quantize=quantize)
    return Model(config, weights, ops, dtype, device, max_len, model_dir=model_dir,
                 quantize=quantize)
