"""Device sampling and the p/q acceptance rule, token for token as ``tileinfer.backend.sampling``.

One program per logit row walks the vocabulary in BLOCK-wide chunks. Greedy and plain
temperature sampling (one pass, no probabilities) split the row over many programs instead
(``_argmax_split_kernel``; the last to arrive picks among the chunks, earlier chunks winning
ties). s = logits * float32(1 / temperature); top-k and top-p thresholds are found by 32
bisection steps over the int32 order keys of s (no sort), each step one counting or masked-sum
pass; the token is Gumbel-max over the kept set with the counter-based hash (lowbias32) in
uint32 arithmetic. Host and device agree bit for bit on s, the keys, the hash and u; sums are
taken in another order than torch's (docs/triton-kernels.md says what that can change).
"""

from __future__ import annotations

import threading

import torch
import triton
import triton.language as tl

from .common import (INTERPRET_MODE, exact_exp, exact_log, next_pow2, pdl_args,
                     pdl_launch_dependents, pdl_wait)
from .rng import ACCEPT_SALT
from .rng import gumbel as _gumbel
from .rng import stream_key as _stream_key
from .rng import stream_key_of as _stream_key_of
from .rng import uniform as _uniform


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
def _sample_kernel(out_ptr, logits_ptr, probs_ptr, seed_ptr, counter_ptr, N, V, s_l, s_p,
                   inv_t, top_k, top_p,
                   GREEDY: tl.constexpr, HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr,
                   PROBS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                   PDL: tl.constexpr):
    """Grid: (cdiv(rows, ROWS),); each program samples ROWS rows."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < N
    row_ptrs = logits_ptr + rows.to(tl.int64) * s_l
    prob_ptrs = probs_ptr + rows.to(tl.int64) * s_p
    if GREEDY:
        tok = _greedy(row_ptrs, V, rmask, ROWS, BLOCK)
        if PROBS:
            for start in range(0, V, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                tl.store(prob_ptrs[:, None] + offs[None, :],
                         tl.where(offs[None, :] == tok[:, None], 1.0, 0.0),
                         mask=rmask[:, None] & (offs < V)[None, :])
    else:
        thr, m, z = _filter(row_ptrs, V, inv_t, rmask, top_k, top_p, HAS_TOPK, HAS_TOPP, ROWS,
                            BLOCK, rmask, rmask)
        keys = _stream_key(seed_ptr, counter_ptr, rows)
        inv_z = 1.0 / z
        best_v = tl.full([ROWS], float("-inf"), tl.float32)
        tok = tl.zeros([ROWS], tl.int32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            s, key, valid = _scores(row_ptrs, offs, V, inv_t, rmask)
            kept = valid & (key >= thr[:, None])
            score = tl.where(kept, s + _gumbel(keys[:, None], offs[None, :]), float("-inf"))
            best_v, tok = _argmax_update(best_v, tok, score, start)
            if PROBS:
                p = tl.where(kept, exact_exp(s - m[:, None]) * inv_z[:, None], 0.0)
                tl.store(prob_ptrs[:, None] + offs[None, :], p, mask=valid)
    tl.store(out_ptr + rows, tok.to(out_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _sample_per_row_kernel(out_ptr, logits_ptr, inv_t_ptr, top_k_ptr, top_p_ptr, seed_ptr,
                           counter_ptr, N, V, s_l, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                           PDL: tl.constexpr):
    """Grid: (cdiv(rows, ROWS),). Each row with its own parameters and stream (seed[j],
    counter[j]): a greedy row (inv_t 0) takes the argmax, the others _sample_kernel's top-k /
    top-p filtered Gumbel-max, each filter applied where the row asks for it."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < N
    row_ptrs = logits_ptr + rows.to(tl.int64) * s_l
    inv_t = tl.load(inv_t_ptr + rows, mask=rmask, other=1.0)
    greedy = inv_t == 0.0
    inv_t = tl.where(greedy, 1.0, inv_t)  # greedy rows: their scores are unused
    top_k = tl.load(top_k_ptr + rows, mask=rmask, other=0)
    top_p = tl.load(top_p_ptr + rows, mask=rmask, other=1.0)
    thr, m, z = _filter(row_ptrs, V, inv_t[:, None], rmask, top_k, top_p, True, True, ROWS,
                        BLOCK, (top_k > 0) & (top_k < V), top_p < 1.0)
    keys = _row_stream_keys(seed_ptr, counter_ptr, rows, rmask)
    best_v = tl.full([ROWS], float("-inf"), tl.float32)
    tok = tl.zeros([ROWS], tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        s, key, valid = _scores(row_ptrs, offs, V, inv_t[:, None], rmask)
        kept = valid & (key >= thr[:, None])
        score = tl.where(kept, s + _gumbel(keys[:, None], offs[None, :]), float("-inf"))
        best_v, tok = _argmax_update(best_v, tok, score, start)
    tok = tl.where(greedy, _greedy(row_ptrs, V, rmask, ROWS, BLOCK), tok)
    tl.store(out_ptr + rows, tok.to(out_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _row_stream_keys(seed_ptr, counter_ptr, rows, rmask):
    """The key of stream (seed[row], counter[row]) of each row, as stream_key."""
    seed = tl.load(seed_ptr + rows, mask=rmask, other=0)
    counter = tl.load(counter_ptr + rows, mask=rmask, other=0)
    return _stream_key_of(seed, counter)


@triton.jit
def _accept_kernel(out_ptr, logits_ptr, draft_ptr, q_ptr, seed_ptr, counter_ptr, N, V, s_l, s_q,
                   inv_t, top_k, top_p,
                   GREEDY: tl.constexpr, HAS_TOPK: tl.constexpr, HAS_TOPP: tl.constexpr,
                   HAS_Q: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                   PDL: tl.constexpr):
    """Grid: (cdiv(rows, ROWS),). The p/q rule of speculative sampling (Leviathan et al. 2023):
    accept draft d if u * q[d] < p[d], else Gumbel-max sample max(p - q, 0)."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < N
    row_ptrs = logits_ptr + rows.to(tl.int64) * s_l
    q_ptrs = q_ptr + rows.to(tl.int64) * s_q
    d = tl.load(draft_ptr + rows, mask=rmask, other=0).to(tl.int32)
    keys = _stream_key(seed_ptr, counter_ptr, rows)
    if GREEDY:  # p is the one-hot of the argmax
        top = _greedy(row_ptrs, V, rmask, ROWS, BLOCK)
        p_d = tl.where(d == top, 1.0, 0.0)
    else:
        thr, m, z = _filter(row_ptrs, V, inv_t, rmask, top_k, top_p, HAS_TOPK, HAS_TOPP, ROWS,
                            BLOCK, rmask, rmask)
        inv_z = 1.0 / z
        s_d = tl.load(row_ptrs + d, mask=rmask, other=0.0) * inv_t
        p_d = tl.where(_order_key(s_d) >= thr, exact_exp(s_d - m) * inv_z, 0.0)
    if HAS_Q:
        q_d = tl.load(q_ptrs + d, mask=rmask, other=0.0)
    else:
        q_d = tl.full([ROWS], 1.0, tl.float32)
    u = _uniform(keys, tl.full([ROWS], ACCEPT_SALT, tl.uint32))
    accept = u * q_d < p_d

    best_v = tl.full([ROWS], float("-inf"), tl.float32)
    tok = tl.zeros([ROWS], tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        if GREEDY:
            valid = rmask[:, None] & (offs < V)[None, :]
            p = tl.where(offs[None, :] == top[:, None], 1.0, 0.0)
        else:
            s, key, valid = _scores(row_ptrs, offs, V, inv_t, rmask)
            p = tl.where(valid & (key >= thr[:, None]), exact_exp(s - m[:, None]) * inv_z[:, None],
                         0.0)
        if HAS_Q:
            q = tl.load(q_ptrs[:, None] + offs[None, :], mask=valid, other=0.0)
        else:
            q = tl.where(offs[None, :] == d[:, None], 1.0, 0.0)
        resid = tl.maximum(p - q, 0.0)
        pos = valid & (resid > 0)
        score = tl.where(pos, exact_log(tl.where(pos, resid, 1.0))
                         + _gumbel(keys[:, None], offs[None, :]), float("-inf"))
        best_v, tok = _argmax_update(best_v, tok, score, start)
    tl.store(out_ptr + rows, tl.where(accept, d, tok).to(out_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _argmax_split_kernel(out_ptr, logits_ptr, seed_ptr, counter_ptr, part_v, part_i, lock_ptr,
                         V, s_l, inv_t, CHUNK,
                         GREEDY: tl.constexpr, BLOCK: tl.constexpr, CHUNKS_PAD: tl.constexpr,
                         PDL: tl.constexpr):
    """Grid: (rows, chunks). The token of greedy / plain temperature sampling of one row, split
    over CHUNK-wide pieces of the vocabulary. Scores are exactly _sample_kernel's (greedy: the
    logits; else s + Gumbel noise). part_v / part_i: (rows, CHUNKS_PAD) chunk maxima and their
    first indices; lock_ptr: one arrival counter per row (zero between launches)."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    rows = row + tl.arange(0, 1)  # [1]: the helpers take row vectors
    rmask = rows >= 0
    row_ptrs = logits_ptr + rows.to(tl.int64) * s_l
    best_v = tl.full([1], float("-inf"), tl.float32)
    best_i = tl.zeros([1], tl.int32)
    lo = chunk * CHUNK
    hi = tl.minimum(lo + CHUNK, V)
    if GREEDY:
        for start in range(lo, hi, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptrs[:, None] + offs[None, :], mask=(offs < hi)[None, :],
                        other=float("-inf"))
            best_v, best_i = _argmax_update(best_v, best_i, x, start)
    else:
        keys = _stream_key(seed_ptr, counter_ptr, rows)
        for start in range(lo, hi, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            sc, key, valid = _scores(row_ptrs, offs, hi, inv_t, rmask)
            x = tl.where(valid, sc + _gumbel(keys[:, None], offs[None, :]), float("-inf"))
            best_v, best_i = _argmax_update(best_v, best_i, x, start)
    slot = row * CHUNKS_PAD + chunk
    tl.store(part_v + slot + tl.arange(0, 1), best_v)
    tl.store(part_i + slot + tl.arange(0, 1), best_i)
    tl.debug_barrier()  # the chunk's result is written before the release below
    chunks = tl.num_programs(1)
    arrived = tl.atomic_add(lock_ptr + row, 1, sem="acq_rel")
    if arrived == chunks - 1:  # the last chunk of this row: pick, in chunk order
        c = tl.arange(0, CHUNKS_PAD)
        cmask = c < chunks
        v = tl.load(part_v + row * CHUNKS_PAD + c, mask=cmask, other=float("-inf"),
                    cache_modifier=".cg")
        i = tl.load(part_i + row * CHUNKS_PAD + c, mask=cmask, other=0, cache_modifier=".cg")
        first = tl.min(tl.where(cmask & (v == tl.max(v, axis=0)), c, CHUNKS_PAD), axis=0)
        tok = tl.sum(tl.where(c == first, i, 0), axis=0)
        tl.store(out_ptr + row, tok.to(out_ptr.dtype.element_ty))
        tl.atomic_xchg(lock_ptr + row, 0)  # re-arm for the next launch / graph replay


# --- launch ------------------------------------------------------------------------------------


SAMPLE_BLOCK = 8192  # vocabulary entries per chunk on the GPU (16 per thread over 16 warps)


def _tiles(n: int, vocab: int):
    """(ROWS, BLOCK, num_warps). GPU: one row per program (rows run on different SMs), 8192-wide
    chunks over 16 warps (the plain loads are not pipelined: wide chunks keep more in flight).
    Interpreter: all rows of a step in one program (its cost is per op)."""
    if INTERPRET_MODE:
        rows = min(next_pow2(n), 64)
        return rows, max(16, min(next_pow2(vocab), 32768 // rows)), 4
    return 1, min(next_pow2(vocab), SAMPLE_BLOCK), 16


# The split argmax: chunk width (GPU / interpreter, where several chunks exercise the pick), and
# its scratch, allocated once per device (from reserve_scratch before graph capture, or on
# first use); rows beyond SPLIT_MAX_ROWS take the one-program kernel.
SPLIT_CHUNK = 4096
SPLIT_CHUNK_INTERPRET = 256
SPLIT_MAX_ROWS = 64
SPLIT_MAX_CHUNKS = 64


class _SplitScratch:
    def __init__(self):
        self._by_device = {}
        self._lock = threading.Lock()

    def get(self, device: torch.device):
        key = (device.type, device.index)
        with self._lock:
            buffers = self._by_device.get(key)
            if buffers is None:
                size = SPLIT_MAX_ROWS * SPLIT_MAX_CHUNKS
                buffers = (torch.empty(size, dtype=torch.float32, device=device),
                           torch.empty(size, dtype=torch.int32, device=device),
                           torch.zeros(SPLIT_MAX_ROWS, dtype=torch.int32, device=device))
                self._by_device[key] = buffers
        return buffers


SCRATCH = _SplitScratch()


def reserve_scratch(device):
    SCRATCH.get(torch.device(device))


def _split_chunk(vocab: int) -> int:
    """Chunk width of the split argmax, or 0 where it does not apply (too many chunks)."""
    chunk = SPLIT_CHUNK_INTERPRET if INTERPRET_MODE else SPLIT_CHUNK
    while triton.cdiv(vocab, chunk) > SPLIT_MAX_CHUNKS:
        chunk *= 2
    return chunk


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


def launch_sample(out, logits, temperature, top_k, top_p, seed, counter, probs_out):
    n, vocab = logits.shape
    if n == 0:
        return
    greedy, has_topk, has_topp, inv_t = _flags(vocab, temperature, top_k, top_p)
    if probs_out is None and not has_topk and not has_topp and n <= SPLIT_MAX_ROWS:
        chunk = _split_chunk(vocab)
        chunks = triton.cdiv(vocab, chunk)
        part_v, part_i, locks = SCRATCH.get(logits.device)
        _argmax_split_kernel[(n, chunks)](
            out, logits, seed, counter, part_v, part_i, locks, vocab, logits.stride(0), inv_t,
            chunk, GREEDY=greedy, BLOCK=chunk, CHUNKS_PAD=SPLIT_MAX_CHUNKS,
            num_warps=8 if chunk >= 2048 else 4, **pdl_args(),
        )
        return
    probs = probs_out if probs_out is not None else logits
    rows, block, warps = _tiles(n, vocab)
    _sample_kernel[(triton.cdiv(n, rows),)](
        out, logits, probs, seed, counter, n, vocab, logits.stride(0), probs.stride(0),
        inv_t, int(top_k), float(top_p),
        GREEDY=greedy, HAS_TOPK=has_topk, HAS_TOPP=has_topp, PROBS=probs_out is not None,
        ROWS=rows, BLOCK=block, num_warps=warps, **pdl_args(),
    )


def launch_sample_per_row(out, logits, inv_temperature, top_k, top_p, seed, counter):
    n, vocab = logits.shape
    if n == 0:
        return
    rows, block, warps = _tiles(n, vocab)
    _sample_per_row_kernel[(triton.cdiv(n, rows),)](
        out, logits, inv_temperature, top_k, top_p, seed, counter, n, vocab, logits.stride(0),
        ROWS=rows, BLOCK=block, num_warps=warps, **pdl_args(),
    )


def launch_accept(out, logits, draft_ids, draft_probs, temperature, top_k, top_p, seed, counter):
    n, vocab = logits.shape
    if n == 0:
        return
    greedy, has_topk, has_topp, inv_t = _flags(vocab, temperature, top_k, top_p)
    q = draft_probs if draft_probs is not None else logits
    rows, block, warps = _tiles(n, vocab)
    _accept_kernel[(triton.cdiv(n, rows),)](
        out, logits, draft_ids, q, seed, counter, n, vocab, logits.stride(0), q.stride(0),
        inv_t, int(top_k), float(top_p),
        GREEDY=greedy, HAS_TOPK=has_topk, HAS_TOPP=has_topp, HAS_Q=draft_probs is not None,
        ROWS=rows, BLOCK=block, num_warps=warps, **pdl_args(),
    )
