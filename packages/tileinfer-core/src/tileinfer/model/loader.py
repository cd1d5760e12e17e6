"""Loading a model folder into a ``Model`` on a backend.

What is checked before anything is allocated: the device (one the backend runs on, and present),
``max_len`` against the model's positions, the config against the checkpoint's headers
(``check_checkpoint``), and the memory the weights and RoPE tables will take against the memory
available on the device (``check_fits``).
"""

from __future__ import annotations

import torch

from ..backend import BackendError, OpTable, get_backend
from ..io.model_dir import resolve_model_dir
from .config import check_max_len, default_max_len, load_config
from .decoder import Model
from .quant import BACKEND_FIELDS, backend_takes, check_quantize
from .weights import Checkpoint, check_checkpoint, expected_weight_bytes, load_weights


class MemoryLimitError(RuntimeError):
    """What a load (or a cache) would allocate exceeds the memory available on its device."""


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**28 else f"{n / 2**20:,.1f} MiB"


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cpu_available() -> int | None:
    """MemAvailable of /proc/meminfo, lowered to what a cgroup v2 memory limit leaves."""
    free = None
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemAvailable:"):
            free = int(line.split()[1]) * 1024
    limit, used = _read("/sys/fs/cgroup/memory.max"), _read("/sys/fs/cgroup/memory.current")
    if limit and used and limit.strip().isdigit() and used.strip().isdigit():
        left = max(0, int(limit) - int(used))
        free = left if free is None else min(free, left)
    return free


def available_memory(device) -> int | None:
    """Bytes that can still be allocated on device: free GPU memory for cuda; for cpu,
    MemAvailable (within a cgroup's limit); None where it cannot be known."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    if device.type == "cpu":
        return _cpu_available()
    return None


def check_fits(nbytes: int, device, what: str):
    """A MemoryLimitError, before allocating, if ``nbytes`` exceed what device has available."""
    free = available_memory(device)
    if free is not None and nbytes > free:
        raise MemoryLimitError(f"{what} needs about {_gib(nbytes)}, but only {_gib(free)} is "
                               f"available on {torch.device(device)}")


def default_device(ops: OpTable) -> torch.device:
    """cuda when the backend runs there and a GPU is present, else cpu if it runs there; an error
    when none of its devices is present."""
    devices = ops.backend.info.devices
    if "cuda" in devices and torch.cuda.is_available():
        return torch.device("cuda")
    if "cpu" in devices:
        return torch.device("cpu")
    raise BackendError(f"backend {ops.name!r} runs on {', '.join(devices)} (BackendInfo.devices) "
                       "and none is present here")


def check_batch_invariant(ops, batch_invariant: bool):
    """A ValueError when batch_invariant is asked of a backend that does not declare it."""
    if batch_invariant and not ops.backend.info.batch_invariant:
        raise ValueError(f"backend {ops.name!r} does not declare batch-invariant ops "
                         "(BackendInfo.batch_invariant); batch_invariant=True needs one that does "
                         "(tileinfer backends lists them)")


def check_fp8(ops, quantize) -> None:
    """quantize="fp8" needs a backend whose linear ops take e4m3 weights (BackendInfo.fp8),
    "fp8-weight-only" one that declares BackendInfo.fp8_weight_only."""
    if not backend_takes(ops.backend.info, quantize):
        raise ValueError(f"backend {ops.name!r} does not declare {quantize} linear ops "
                         f"(BackendInfo.{BACKEND_FIELDS[quantize]}); quantize={quantize!r} needs "
                         "one that does (tileinfer backends lists them)")


def load_model(model=None, dtype: torch.dtype = torch.bfloat16, backend="ref", device=None,
               max_len: int | None = None, quantize: str | None = None,
               allow_long: bool = False, batch_invariant: bool = False,
               rope_scaling: dict | None = None) -> Model:
    """Load a model (anything ``resolve_model_dir`` takes: a folder, a pulled repo id, an
    imported model's name, a .gguf file, or None for the embedded default model) to run on
    backend.

    dtype: the activation and weight dtype. device: default ``default_device``. max_len: the
    longest sequence (positions the RoPE tables cover); default 4096, or the model's
    ``max_position_embeddings`` or attention window if smaller. A max_len beyond those positions
    is refused unless ``allow_long=True`` (then a ``LongContextWarning``). quantize: None,
    "int8" for INT8 weight-only linear layers, "fp8" for e4m3 weights and per-token e4m3
    activations (the backend must declare ``BackendInfo.fp8``), or "fp8-weight-only" for e4m3
    weights and activations in dtype (``BackendInfo.fp8_weight_only``; ``tileinfer.model.quant``).
    batch_invariant: every step's rows the same bits whatever else the step holds, so an answer
    does not depend on the load (docs/determinism.md); the backend must declare it
    (``BackendInfo.batch_invariant``). rope_scaling: a RoPE dict in config.json's form that
    replaces the model's (``load_config``), e.g. ``{"rope_type": "yarn", "factor": 4.0,
    "original_max_position_embeddings": 32768}`` for Qwen3's long contexts.
    """
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int)
                                or max_len < 1):
        raise ValueError(f"max_len must be a positive integer, got {max_len!r}")
    check_quantize(quantize)
    ops = get_backend(backend)
    check_batch_invariant(ops, batch_invariant)
    check_fp8(ops, quantize)
    device = torch.device(device) if device is not None else default_device(ops)
    if device.type not in ops.backend.info.devices:
        raise ValueError(f"backend {ops.name!r} runs on {', '.join(ops.backend.info.devices)}, "
                         f"not {device.type}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BackendError("no CUDA GPU is present here (device 'cuda')")
    model_dir = resolve_model_dir(model)
    config = load_config(model_dir, rope_scaling)
    if max_len is None:
        max_len = default_max_len(config)
    check_max_len(config, max_len, allow_long)
    with Checkpoint(model_dir) as ckpt:
        check_checkpoint(config, ckpt)
    weights = expected_weight_bytes(config, dtype, quantize)
    # cos and sin (max_len, head_dim / 2) float32, computed on the CPU first (with temporaries
    # of their size there) and then moved.
    rope = 2 * max_len * (config.head_dim // 2) * 4
    on_cpu = device.type == "cpu"
    check_fits(weights + (3 if on_cpu else 1) * rope, device,
               f"loading {model_dir.name} (weights {_gib(weights)}, RoPE tables for max_len "
               f"{max_len} {_gib(rope)})")
    if not on_cpu:
        check_fits(3 * rope, "cpu", f"computing the RoPE tables for max_len {max_len}")
    weights = load_weights(config, model_dir, dtype=dtype, device=device, quantize=quantize)
    return Model(config, weights, ops, dtype, device, max_len, model_dir=model_dir,
                 quantize=quantize, batch_invariant=batch_invariant)
