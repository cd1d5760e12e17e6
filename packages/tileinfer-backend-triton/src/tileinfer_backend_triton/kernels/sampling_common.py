"""What the Triton sampling kernels share, token for token as ``tileinfer.backend.sampling``.

s = logits * float32(1 / temperature); top-k and top-p thresholds are found by 32 bisection steps
over the int32 order keys of s (no sort), each step one counting or masked-sum pass; a token is
Gumbel-max over the kept set with the counter-based hash (lowbias32) in uint32 arithmetic. Host
and device agree bit for bit on s, the keys, the hash and u; sums are taken in another order than
torch's (docs/triton-kernels.md says what that can change). Here: those device helpers (a
[ROWS, BLOCK] tile of a row's scores, the thresholds, the running argmax, greedy rows, each row's
stream key) and the host's launch shapes and flags. The kernels: sampling.py (sample_tokens,
sample_per_row) and accept.py (accept_tokens).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import INTERPRET_MODE, exact_exp, next_pow2
from .rng import stream_key_of as _stream_key_of


@triton.jit
def _scores(row_ptrs, offs, V, inv_t, rmask):
    """Scaled logits s, their int32 order keys and the valid mask of a [ROWS, BLOCK] chunk."""
    valid = rmask[:, None] & (offs < V)[None, :]
    s = tl.load(row_ptrs[:, None] + offs[None, :], mask=valid, other=float("-inf")) * inv_t
    return s, _order_key(s), valid


@triton.jit
def _order_key(s):
    bits = s.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _row_max(row_ptrs, V, inv_t, rmask, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    best = tl.full([ROWS, BLOCK], float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        s, key, valid = _scores(row_ptrs, start + tl.arange(0, BLOCK), V, inv_t, rmask)
        best = tl.maximum(best, s)
    return tl.max(best, axis=1)


@triton.jit
def _count_ge(row_ptrs, V, inv_t, rmask, thr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.zeros([ROWS, BLOCK], tl.int32)
    for start in range(0, V, BLOCK):
        s, key, valid = _scores(row_ptrs, start + tl.arange(0, BLOCK), V, inv_t, rmask)
        n += (valid & (key >= thr[:, None])).to(tl.int32)
    return tl.sum(n, axis=1)


@triton.jit
def _mass_ge(row_ptrs, V, inv_t, rmask, m, thr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Per row: the sum of exp(s - m) over keys >= thr, always in the same order."""
    z = tl.zeros([ROWS, BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        s, key, valid = _scores(row_ptrs, start + tl.arange(0, BLOCK), V, inv_t, rmask)
        z += tl.where(valid & (key >= thr[:, None]), exact_exp(s - m[:, None]), 0.0)
    return tl.sum(z, axis=1)


@triton.jit
def _filter(row_ptrs, V, inv_t, rmask, top_k, top_p, HAS_TOPK: tl.constexpr,
            HAS_TOPP: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, topk_on, topp_on):
    """Per row (thr, m, z): kept = key >= thr; m = max s (always kept); z = sum kept exp(s - m).
    topk_on / topp_on ([ROWS] bool): the rows whose filter applies (per-row parameters; rmask
    when one set of parameters holds for every row); the others are left unfiltered, exactly."""
    m = tl.where(rmask, _row_max(row_ptrs, V, inv_t, rmask, ROWS, BLOCK), 0.0)  # 0: padding rows
    thr = tl.full([ROWS], -2147483648, tl.int32)
    if HAS_TOPK:  # largest t with count(key >= t) >= top_k: 32 bisection steps
        lo = tl.full([ROWS], -2147483648, tl.int64)
        hi = tl.full([ROWS], 2147483648, tl.int64)
        for _ in range(32):
            mid = lo + (hi - lo) // 2
            ok = _count_ge(row_ptrs, V, inv_t, rmask, mid.to(tl.int32), ROWS, BLOCK) >= top_k
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid)
        thr = tl.where(topk_on, lo.to(tl.int32), thr)
    z = _mass_ge(row_ptrs, V, inv_t, rmask, m, thr, ROWS, BLOCK)
    if HAS_TOPP:  # largest t whose upper set (within the kept) holds top_p of the kept mass
        need = top_p * z
        lo = tl.full([ROWS], -2147483648, tl.int64)
        hi = tl.full([ROWS], 2147483648, tl.int64)
        z_lo = z  # the mass at lo (every kept token)
        for _ in range(32):
            mid = lo + (hi - lo) // 2
            mass = _mass_ge(row_ptrs, V, inv_t, rmask, m, tl.maximum(mid.to(tl.int32), thr),
                            ROWS, BLOCK)
            ok = mass >= need
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid)
            z_lo = tl.where(ok, mass, z_lo)
        thr = tl.where(topp_on, tl.maximum(thr, lo.to(tl.int32)), thr)
        z = tl.where(topp_on, z_lo, z)
    return thr, m, tl.where(rmask, z, 1.0)


@triton.jit
def _argmax_update(best_v, best_i, vals, start):
    """Fold a [ROWS, BLOCK] chunk into running (max, first index); earlier chunks win ties."""
    v = tl.max(vals, axis=1)
    i = tl.argmax(vals, axis=1) + start
    take = v > best_v
    return tl.where(take, v, best_v), tl.where(take, i, best_i)


@triton.jit
def _greedy(row_ptrs, V, rmask, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    best_v = tl.full([ROWS], float("-inf"), tl.float32)
    best_i = tl.zeros([ROWS], tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(row_ptrs[:, None] + offs[None, :], mask=rmask[:, None] & (offs < V)[None, :],
                    other=float("-inf"))
        best_v, best_i = _argmax_update(best_v, best_i, x, start)
    return best_i


@triton.jit
def _row_stream_keys(seed_ptr, counter_ptr, rows, rmask):
    """The key of stream (seed[row], counter[row]) of each row, as stream_key."""
    seed = tl.load(seed_ptr + rows, mask=rmask, other=0)
    counter = tl.load(counter_ptr + rows, mask=rmask, other=0)
    return _stream_key_of(seed, counter)



# --- launch shapes and flags ---------------------------------------------------------------------


SAMPLE_BLOCK = 8192  # vocabulary entries per chunk on the GPU (16 per thread over 16 warps)


def _tiles(n: int, vocab: int):
    """(ROWS, BLOCK, num_warps). GPU: one row per program (rows run on different SMs), 8192-wide
    chunks over 16 warps (the plain loads are not pipelined: wide chunks keep more in flight).
    Interpreter: all rows of a step in one program (its cost is per op)."""
    if INTERPRET_MODE:
        rows = min(next_pow2(n), 64)
        return rows, max(16, min(next_pow2(vocab), 32768 // rows)), 4
    return 1, min(next_pow2(vocab), SAMPLE_BLOCK), 16


def _inv_temperature(temperature: float) -> float:
    """float32(1 / temperature), as SamplingParams.inv_temperature."""
    return float(torch.tensor(1.0 / temperature, dtype=torch.float32))


def _flags(vocab, temperature, top_k, top_p):
    greedy = temperature == 0
    has_topk = (not greedy) and 0 < int(top_k) < vocab
    has_topp = (not greedy) and float(top_p) < 1
    inv_t = 1.0 if greedy else _inv_temperature(float(temperature))
    # top_p enters as float32(top_p), as torch multiplies a float32 tensor by a Python float.
    return greedy, has_topk, has_topp, inv_t
