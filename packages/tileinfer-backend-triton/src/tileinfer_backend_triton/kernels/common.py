"""Shared pieces of the kernels: interpreter switches, exact math helpers, launch heuristics.

Under ``TRITON_INTERPRET=1`` (CI without a GPU) Triton runs every program in NumPy. Two of its
gaps shape the helpers here: a ``tl.dot`` of bf16 operands returns garbage (so ``mma`` casts the
operands to float32 first), and libdevice is not available (so the precise ``log``/``exp``/
``expm1`` fall back to ``tl.log``/``tl.exp``, which NumPy computes precisely anyway). On the GPU
the precise libdevice versions are used where a result must match PyTorch's to the last bit
(sampling noise, SiLU, xIELU), and the fast ``exp2`` where it need not (softmax in attention).
"""

from __future__ import annotations

import functools
import os
import threading

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

INTERPRET_MODE = os.environ.get("TRITON_INTERPRET", "0") == "1"
INTERPRET = tl.constexpr(INTERPRET_MODE)


def _patch_interpreter_index():
    """Triton 3.6's interpreter turns a scalar into an int with ``int(ndarray of shape (1,))``,
    which NumPy >= 2.4 refuses, so a loop with run-time bounds (``range(lo, hi, BLOCK)``) fails.
    Apply the upstream fix (triton-lang/triton#9171: ``int(data.squeeze())``) when interpreting."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_tileinfer_patched", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched._tileinfer_patched = True
    interpreter._patch_lang_tensor = patched


if INTERPRET_MODE:
    _patch_interpreter_index()

if not INTERPRET_MODE:
    from triton.language.extra import libdevice

    @triton.jit
    def exact_log(x):
        return libdevice.log(x)

    @triton.jit
    def exact_exp(x):
        return libdevice.exp(x)

    @triton.jit
    def exact_expm1(x):
        return libdevice.expm1(x)

else:  # NumPy's log/exp are correctly rounded to within an ulp already.

    @triton.jit
    def exact_log(x):
        return tl.log(x)

    @triton.jit
    def exact_exp(x):
        return tl.exp(x)

    @triton.jit
    def exact_expm1(x):
        # Kahan's expm1 from exp and log: accurate near 0 where exp(x) - 1 cancels.
        u = tl.exp(x)
        um1 = u - 1.0
        safe_log = tl.where(um1 == 0.0, 1.0, tl.log(u))
        return tl.where(um1 == 0.0, x, tl.where(um1 == -1.0, -1.0, um1 * x / safe_log))


@triton.jit
def cast_to(x, ty: tl.constexpr):
    """``x.to(ty)``, rounding to nearest even. (The GPU's cast does; the interpreter truncates
    float32 to bf16, so there the rounding is done on the bits first.)"""
    if INTERPRET:
        if ty == tl.bfloat16:
            bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & tl.full([], 0xFFFF0000, tl.uint32)
            x = bits.to(tl.float32, bitcast=True)
    return x.to(ty)


@triton.jit
def int8_to(w, ty: tl.constexpr):
    """INT8 weights/cache values to the dot operand type (exact in bf16/fp16). The interpreter's
    int8 -> bf16 conversion is broken; it gets float32 (its dots run in float32 anyway)."""
    if INTERPRET:
        return w.to(tl.float32)
    else:
        return w.to(ty)


@triton.jit
def e4m3_bits_to_float(w):
    """e4m3 bit patterns (uint8: the weights of the weight-only FP8 product) as their float32
    values, exactly, with no float32 subnormal on the way (a GPU build may flush those): a normal
    value's exponent rebiased from e4m3's 7 to float32's 127, a subnormal's m * 2^-9."""
    b = w.to(tl.uint32)
    e = (b >> 3) & 0xF
    m = b & 0x7
    normal = (((b & 0x80) << 24) | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    sub = tl.where((b & 0x80) != 0, -sub, sub)
    return tl.where(e == 0, sub, normal)


@triton.jit
def weight_to(w, ty: tl.constexpr):
    """One-byte weights (int8, or e4m3 bits) to ty, exactly (float32 under the interpreter, as
    int8_to)."""
    if w.dtype == tl.uint8:
        v = e4m3_bits_to_float(w)
        if not INTERPRET:
            v = v.to(ty)
        return v
    else:
        return int8_to(w, ty)


@triton.jit
def mma(a, b, acc, F32: tl.constexpr):
    """``acc + a @ b`` with float32 accumulation on the tensor cores.

    bf16/fp16 operands go to the tensor cores as they are (exact products); F32 (a float32 model)
    asks for IEEE float32 products instead of TF32. The interpreter multiplies in float64 and
    rounds each product tile to float32: NumPy's float32 matmul (OpenBLAS) sums a row in an
    order that depends on the row's place in the tile on some CPUs, so a row would differ from
    itself alone; in float64 the sums of bf16 products are exact, and of float32 ones nearly so,
    whatever the order.
    """
    if INTERPRET:
        # (through float32: the interpreter converts e4m3 to float32, not to float64)
        a64 = a.to(tl.float32).to(tl.float64)
        b64 = b.to(tl.float32).to(tl.float64)
        return acc + tl.dot(a64, b64, input_precision="ieee").to(tl.float32)
    elif F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, out_dtype=tl.float32)


@triton.jit
def round_half_even(x):
    """``torch.round`` (round half to even) for |x| < 2**22, from floor."""
    r = tl.floor(x + 0.5)
    tie = (r - x) == 0.5
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where(tie & odd, r - 1.0, r)


@triton.jit
def silu(x):
    """``x * sigmoid(x)`` as PyTorch computes it in float32: ``x / (1 + exp(-x))``."""
    return tl.math.div_rn(x, 1.0 + exact_exp(-x))


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of the device (a small pretend device under the interpreter,
    so that the split paths of the launch heuristics are exercised on the CPU too)."""
    if INTERPRET_MODE or device.type != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def tl_dtype(dtype: torch.dtype):
    return {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16,
            torch.int8: tl.int8}[dtype]


# --- programmatic dependent launch ------------------------------------------------------------
#
# A kernel launched with ``launch_pdl`` (Hopper) may start while the previous one still runs: it
# calls ``pdl_wait()`` (griddepcontrol.wait) before it touches what an earlier kernel writes or
# reads, and ``pdl_launch_dependents()`` to let the next kernel launch. Work that depends on no
# earlier kernel (a GEMV's first weight tiles) may come before the wait. Both are no-ops in a
# kernel launched without the attribute. docs/triton-kernels.md has more.

PDL_SUPPORTED = False  # griddepcontrol needs sm_90 (and a GPU: never under the interpreter)
if not INTERPRET_MODE:
    try:
        PDL_SUPPORTED = (torch.cuda.is_available()
                         and torch.cuda.get_device_capability()[0] >= 9)
    except Exception:  # pragma: no cover - a broken driver: run without
        PDL_SUPPORTED = False


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    if PDL:
        gdc_wait()


@triton.jit
def pdl_launch_dependents(PDL: tl.constexpr):
    if PDL:
        gdc_launch_dependents()


_pdl_enabled = PDL_SUPPORTED and os.environ.get("TILEINFER_TRITON_PDL", "1") != "0"


def set_pdl(enabled: bool) -> bool:
    """Turn programmatic dependent launch on or off for later launches (benchmarks compare
    both); returns the previous setting. Ignored where the GPU does not support it."""
    global _pdl_enabled
    previous = _pdl_enabled
    _pdl_enabled = bool(enabled) and PDL_SUPPORTED
    return previous


def pdl_args() -> dict:
    """Launch arguments of every kernel: the kernel's PDL switch and Triton's launch option."""
    return {"PDL": _pdl_enabled, "launch_pdl": _pdl_enabled}


class DeviceScratch:
    """Buffers the kernels keep per device, made by ``make(device)`` (a tuple of tensors) once:
    by the backend's ``reserve_scratch`` (called before graph capture) or on first use."""

    def __init__(self, make):
        self._make = make
        self._by_device = {}
        self._lock = threading.Lock()

    def get(self, device: torch.device):
        key = (device.type, device.index)
        buffers = self._by_device.get(key)
        if buffers is None:
            with self._lock:
                buffers = self._by_device.get(key)
                if buffers is None:
                    buffers = self._by_device[key] = self._make(device)
        return buffers
