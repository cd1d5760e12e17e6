"""What every op module shares: dtype names, layout checks, device properties, the per-device
scratch, kernel loading and the one fallback to the ref backend.

Every op writes into the tensors it is given, allocates nothing and never reads device memory on
the host, so a whole step can be captured in a CUDA graph. Inputs the kernels do not handle go to
the ref backend's op of the same name through ``fallback``, which counts each such call by
reason in ``fallback_counts`` (the ref op is correct but may allocate).
"""

from __future__ import annotations

import threading
from collections import Counter

import torch
import tileinfer_backend_ref as _ref

from .. import compiler

# The kernels' element type names (common.cuh) of the activation dtypes.
DTYPE_NAMES = {torch.bfloat16: "bf16_t", torch.float16: "f16_t", torch.float32: "float"}

# Decode GEMV for at most this many token rows (gemv_rows.cu's MAX_TOKENS; gemv.cu: the n = 8
# side of one mma).
GEMV_MAX_TOKENS = 8

# The one-byte linear weights, both laid out alike (gemv.cu's W_INT8 builds): int8 values, and
# uint8 holding e4m3 bit patterns (the weight-only FP8 product; the kernels' W_E4M3 builds).
ONE_BYTE_WEIGHTS = (torch.int8, torch.uint8)


def one_byte(weight: torch.Tensor) -> bool:
    return weight.dtype in ONE_BYTE_WEIGHTS


def weight_defines(weight: torch.Tensor) -> dict:
    """The defines that say how a linear kernel reads weight's bytes (W_E4M3 for e4m3 bits)."""
    return {"W_E4M3": 1} if weight.dtype == torch.uint8 else {}


fallback_counts: Counter = Counter()


def fallback(op: str, why: str, *args):
    """Run the ref backend's ``op`` on ``args`` (the op's own arguments), counted under why."""
    fallback_counts[f"{op}: {why}"] += 1
    return getattr(_ref, op)(*args)


def kernel(file, name, signature, device, defines=None, extra_options=()):
    """Kernel ``name`` of ``file`` built with ``defines`` (compiled or loaded once, then cached).
    signature: the argument kinds, p pointer, i int32, q int64, f float32 (compiler._CTYPES)."""
    return compiler.load_module(file, device, defines, extra_options).kernel(name, signature)


# --- layouts -------------------------------------------------------------------------------------


def dev(t: torch.Tensor) -> int:
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def aligned(*tensors, nbytes=16) -> bool:
    return all(t is None or t.data_ptr() % nbytes == 0 for t in tensors)


def contig(*tensors) -> bool:
    return all(t is None or t.is_contiguous() for t in tensors)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def vec(dtype, *counts_and_tensors) -> int:
    """Elements per 16-byte access when every count divides and every tensor is aligned, else 1."""
    n = 16 // torch.empty((), dtype=dtype).element_size()
    for item in counts_and_tensors:
        if isinstance(item, int):
            if item % n:
                return 1
        elif item is not None and item.data_ptr() % 16:
            return 1
    return n


# --- device properties ---------------------------------------------------------------------------

_device_properties: dict[tuple[int, str], int] = {}


def device_property(device: int, name: str, default: int | None = None) -> int:
    """``torch.cuda.get_device_properties(device).<name>`` (default where torch lacks it), read
    once per device."""
    key = (device, name)
    value = _device_properties.get(key)
    if value is None:
        props = torch.cuda.get_device_properties(device)
        value = _device_properties[key] = (getattr(props, name) if default is None
                                           else getattr(props, name, default))
    return value


def num_sms(device: int) -> int:
    return device_property(device, "multi_processor_count")


def smem_limit(device: int) -> int:
    """The most shared memory one block may opt in to (227 KB on an H100/H200)."""
    return device_property(device, "shared_memory_per_block_optin", 227 * 1024)


def fit_stages(cfg: dict, smem_bytes, device: int, blocks_per_sm: int = 1,
               least: int = 2) -> dict:
    """cfg with its stages brought down (to `least` at least) until smem_bytes(cfg), a block's
    dynamic shared memory in a GEMM kernel, fits beside the static shared memory, with
    blocks_per_sm such blocks on one SM (each of them 1 KB reserved besides)."""
    limit = smem_limit(device)
    if blocks_per_sm > 1:
        limit = min(limit, smem_per_multiprocessor(device) // blocks_per_sm - 1024)
    limit -= 1024  # room for the static shared memory
    while cfg["stages"] > least and smem_bytes(cfg) > limit:
        cfg["stages"] -= 1
    return cfg


def smem_per_multiprocessor(device: int) -> int:
    """Shared memory of one SM, for all its blocks (228 KB on an H100/H200)."""
    return device_property(device, "shared_memory_per_multiprocessor", 228 * 1024)


# --- per-device scratch --------------------------------------------------------------------------


class DeviceScratch:
    """Buffers allocated once per device by ``reserve`` (the reserve_scratch op, which a model
    runner calls before it captures graphs) or on first use outside a capture; never grown.
    ``make(device)`` returns the buffers; counters among them must start at zero."""

    def __init__(self, make):
        self._make = make
        self._by_device: dict[int, tuple[torch.Tensor, ...]] = {}
        self._lock = threading.Lock()

    def reserve(self, device):
        """The device's buffers, allocated on the first call (not inside a graph capture: None)."""
        device = torch.device(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        buffers = self._by_device.get(index)
        if buffers is None and not torch.cuda.is_current_stream_capturing():
            with self._lock:
                buffers = self._by_device.get(index)
                if buffers is None:
                    cuda = torch.device("cuda", index)
                    buffers = self._make(cuda)
                    torch.cuda.synchronize(cuda)  # the counters are zero before any stream uses them
                    self._by_device[index] = buffers
        return buffers

    def get(self, device: int):
        """The buffers, or None where they are missing and cannot be allocated now (a capture)."""
        return self._by_device.get(device) or self.reserve(device)


class GemvScratch(DeviceScratch):
    """gemv_rows.cu's split-K scratch: float32 partial sums [split][mat][token][O] and one
    arrival counter per row tile (zero between launches: the last block of a tile re-arms it). A
    launch that needs more than it holds runs without split-K (decided from the shape alone, so
    never differently for 1 and 8 tokens)."""

    PARTIALS = 1 << 21  # floats (8 MiB)
    COUNTERS = 1 << 15

    def __init__(self):
        super().__init__(lambda d: (torch.empty(self.PARTIALS, dtype=torch.float32, device=d),
                                    torch.zeros(self.COUNTERS, dtype=torch.int32, device=d)))

    @classmethod
    def fits(cls, splits: int, mats: int, n_rows: int) -> bool:
        """Room for a launch: partials of every split, mat and token slot; a counter per row tile
        (n_rows bounds the tiles for every rows value)."""
        return splits * mats * GEMV_MAX_TOKENS * n_rows <= cls.PARTIALS and n_rows <= cls.COUNTERS


class ArgmaxScratch(DeviceScratch):
    """sampling.cu's argmax_split: each chunk's maximum, its index and its sum, [row][chunk],
    and one arrival counter per row (zero between launches)."""

    ROWS = 64
    CHUNKS = 256  # of ARGMAX_CHUNK logits: vocabularies up to 1M
    ARGMAX_CHUNK = 4096

    def __init__(self):
        n = self.ROWS * self.CHUNKS
        super().__init__(lambda d: (torch.empty(n, dtype=torch.float32, device=d),
                                    torch.empty(n, dtype=torch.int32, device=d),
                                    torch.zeros(self.ROWS, dtype=torch.int32, device=d),
                                    torch.empty(n, dtype=torch.float32, device=d)))


class Fp8Scratch(DeviceScratch):
    """linear_fp8.py's quantized input of one product: e4m3 values (BYTES) and one float32
    scale per row. Reserved on GPUs with FP8 (compute capability 8.9 and newer)."""

    BYTES = 1 << 24  # 16 MiB: 1,170 rows of K = 14,336
    ROWS = 1 << 14

    def __init__(self):
        super().__init__(lambda d: (torch.empty(self.BYTES, dtype=torch.uint8, device=d),
                                    torch.empty(self.ROWS, dtype=torch.float32, device=d)))


class StreamScratch(DeviceScratch):
    """gemm_fp8_stream.cu's sums of the segments that do not start their row tile, one slot of
    a block's threads' sums per block of the grid, and one flag per block (zero between
    launches: the block that reads a slot lowers its flag). A launch whose grid needs more
    slots than it holds runs gemm_wgmma.cu instead."""

    PARTIALS = 1 << 22  # floats (16 MiB): 264 blocks of 256 threads x 64 sums
    FLAGS = 1 << 10

    def __init__(self):
        super().__init__(lambda d: (torch.empty(self.PARTIALS, dtype=torch.float32, device=d),
                                    torch.zeros(self.FLAGS, dtype=torch.int32, device=d)))

    @classmethod
    def fits(cls, blocks: int, block_sums: int) -> bool:
        """Room for a grid of `blocks` blocks whose threads keep block_sums sums in all."""
        return blocks * block_sums <= cls.PARTIALS and blocks <= cls.FLAGS


FP8_CAPABILITY = (8, 9)
GEMV_SCRATCH = GemvScratch()
ARGMAX_SCRATCH = ArgmaxScratch()
FP8_SCRATCH = Fp8Scratch()
STREAM_SCRATCH = StreamScratch()


def reserve_scratch(device):
    """Every scratch the ops keep, allocated on ``device`` now (outside any graph capture)."""
    GEMV_SCRATCH.reserve(device)
    ARGMAX_SCRATCH.reserve(device)
    if torch.cuda.get_device_capability(device) >= FP8_CAPABILITY:
        FP8_SCRATCH.reserve(device)
    if torch.cuda.get_device_capability(device) == (9, 0):  # gemm_fp8_stream.cu is Hopper's
        STREAM_SCRATCH.reserve(device)
