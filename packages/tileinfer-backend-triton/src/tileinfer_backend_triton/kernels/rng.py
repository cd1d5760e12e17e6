"""The counter-based random stream of ``tileinfer.backend.sampling`` on the device: lowbias32
(``mix32``) in uint32 arithmetic with wrapping products, which is what the host's int64
``(x * C) & 0xFFFFFFFF`` computes, so host and device draw the same bits."""

from __future__ import annotations

import triton
import triton.language as tl

from .common import exact_log

_MUL1 = tl.constexpr(0x7FEB352D)
_MUL2 = tl.constexpr(0x1B873593)
_GOLDEN = tl.constexpr(0x9E3779B9)
ACCEPT_SALT = tl.constexpr(0xFFFFFFFF)  # tileinfer.backend.sampling.ACCEPT_SALT


@triton.jit
def mix32(x):
    """lowbias32 on uint32 (wrapping products)."""
    x = x ^ (x >> 16)
    x = x * tl.full([], _MUL1, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full([], _MUL2, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def stream_key(seed_ptr, counter_ptr, rows):
    """The 32-bit key of stream (seed, counter + row), as tileinfer.backend.sampling.stream_key."""
    return stream_key_of(tl.load(seed_ptr), tl.load(counter_ptr) + rows)


@triton.jit
def stream_key_of(seed, counter):
    """The 32-bit key of stream (seed, counter), int64 values."""
    key = mix32(seed.to(tl.uint32) ^ tl.full([], _GOLDEN, tl.uint32))
    key = mix32(key ^ (seed >> 32).to(tl.uint32))
    return mix32(key ^ counter.to(tl.uint32))


@triton.jit
def uniform(key, index):
    """float32 uniform in (0, 1) for (key, index), index uint32: (bits23 + 0.5) / 2**23."""
    bits = mix32(mix32(key ^ index)) >> 9
    return (bits.to(tl.float32) + 0.5) * (1.0 / 8388608.0)


@triton.jit
def gumbel(key, offs):
    return -exact_log(-exact_log(uniform(key, offs.to(tl.uint32))))
