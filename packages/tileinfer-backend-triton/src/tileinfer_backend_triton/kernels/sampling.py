"""Device sampling: ``sample_tokens`` and ``sample_per_row``, token for token as
``tileinfer.backend.sampling``.

One program per logit row walks the vocabulary in BLOCK-wide chunks. Greedy and plain
temperature sampling (one pass, no probabilities) split the row over many programs instead
(``_argmax_split_kernel``; the last to arrive picks among the chunks, earlier chunks winning
ties). The scores, thresholds and Gumbel-max are sampling_common.py's; the p/q acceptance rule
of speculative decoding is accept.py's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (INTERPRET_MODE, DeviceScratch, exact_exp, pdl_args, pdl_launch_dependents,
                     pdl_wait)
from .rng import gumbel as _gumbel
from .rng import stream_key as _stream_key
from .sampling_common import (_argmax_update, _filter, _flags, _greedy, _row_stream_keys, _scores,
                              _tiles)


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
def _argmax_split_kernel(out_ptr, logits_ptr, seed_ptr, counter_ptr, part_v, part_i, lock_ptr,
                         sums_ptr, part_s, V, s_l, inv_t, CHUNK,
                         GREEDY: tl.constexpr, SUMS: tl.constexpr, BLOCK: tl.constexpr,
                         CHUNKS_PAD: tl.constexpr, PDL: tl.constexpr):
    """Grid: (rows, chunks). The token of greedy / plain temperature sampling of one row, split
    over CHUNK-wide pieces of the vocabulary. Scores are exactly _sample_kernel's (greedy: the
    logits; else s + Gumbel noise). part_v / part_i: (rows, CHUNKS_PAD) chunk maxima and their
    first indices; lock_ptr: one arrival counter per row (zero between launches). SUMS (greedy
    only): also each chunk's sum into part_s and the row's into sums_ptr (the engine's check
    for NaN or infinity, tileinfer/engine/runtime/finite.py)."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    rows = row + tl.arange(0, 1)  # [1]: the helpers take row vectors
    rmask = rows >= 0
    row_ptrs = logits_ptr + rows.to(tl.int64) * s_l
    best_v = tl.full([1], float("-inf"), tl.float32)
    best_i = tl.zeros([1], tl.int32)
    total = tl.zeros([1], tl.float32)
    lo = chunk * CHUNK
    hi = tl.minimum(lo + CHUNK, V)
    if GREEDY:
        for start in range(lo, hi, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            x = tl.load(row_ptrs[:, None] + offs[None, :], mask=(offs < hi)[None, :],
                        other=float("-inf"))
            best_v, best_i = _argmax_update(best_v, best_i, x, start)
            if SUMS:
                total += tl.sum(tl.where((offs < hi)[None, :], x, 0.0), axis=1)
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
    if SUMS:
        tl.store(part_s + slot + tl.arange(0, 1), total)
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
        if SUMS:
            parts = tl.load(part_s + row * CHUNKS_PAD + c, mask=cmask, other=0.0,
                            cache_modifier=".cg")
            tl.store(sums_ptr + row, tl.sum(parts, axis=0))
        tl.atomic_xchg(lock_ptr + row, 0)  # re-arm for the next launch / graph replay


# --- launch ------------------------------------------------------------------------------------


# The split argmax: chunk width (GPU / interpreter, where several chunks exercise the pick), and
# its scratch, allocated once per device (from reserve_scratch before graph capture, or on
# first use); rows beyond SPLIT_MAX_ROWS take the one-program kernel.
SPLIT_CHUNK = 4096
SPLIT_CHUNK_INTERPRET = 256
SPLIT_MAX_ROWS = 64
SPLIT_MAX_CHUNKS = 64


SCRATCH = DeviceScratch(lambda device: (
    torch.empty(SPLIT_MAX_ROWS * SPLIT_MAX_CHUNKS, dtype=torch.float32, device=device),
    torch.empty(SPLIT_MAX_ROWS * SPLIT_MAX_CHUNKS, dtype=torch.int32, device=device),
    torch.zeros(SPLIT_MAX_ROWS, dtype=torch.int32, device=device),
    torch.empty(SPLIT_MAX_ROWS * SPLIT_MAX_CHUNKS, dtype=torch.float32, device=device)))


def reserve_scratch(device):
    SCRATCH.get(torch.device(device))


def _split_chunk(vocab: int) -> int:
    """Chunk width of the split argmax, or 0 where it does not apply (too many chunks)."""
    chunk = SPLIT_CHUNK_INTERPRET if INTERPRET_MODE else SPLIT_CHUNK
    while triton.cdiv(vocab, chunk) > SPLIT_MAX_CHUNKS:
        chunk *= 2
    return chunk


def launch_sample(out, logits, temperature, top_k, top_p, seed, counter, probs_out, sums=None):
    """sample_tokens; with sums (greedy rows in the split argmax only), also each row's sum.
    Whether it wrote the sums."""
    n, vocab = logits.shape
    if n == 0:
        return True
    greedy, has_topk, has_topp, inv_t = _flags(vocab, temperature, top_k, top_p)
    if probs_out is None and not has_topk and not has_topp and n <= SPLIT_MAX_ROWS:
        chunk = _split_chunk(vocab)
        chunks = triton.cdiv(vocab, chunk)
        part_v, part_i, locks, part_s = SCRATCH.get(logits.device)
        with_sums = sums is not None and greedy
        _argmax_split_kernel[(n, chunks)](
            out, logits, seed, counter, part_v, part_i, locks, sums if with_sums else part_s,
            part_s, vocab, logits.stride(0), inv_t, chunk, GREEDY=greedy, SUMS=with_sums,
            BLOCK=chunk, CHUNKS_PAD=SPLIT_MAX_CHUNKS,
            num_warps=8 if chunk >= 2048 else 4, **pdl_args(),
        )
        return with_sums
    probs = probs_out if probs_out is not None else logits
    rows, block, warps = _tiles(n, vocab)
    _sample_kernel[(triton.cdiv(n, rows),)](
        out, logits, probs, seed, counter, n, vocab, logits.stride(0), probs.stride(0),
        inv_t, int(top_k), float(top_p),
        GREEDY=greedy, HAS_TOPK=has_topk, HAS_TOPP=has_topp, PROBS=probs_out is not None,
        ROWS=rows, BLOCK=block, num_warps=warps, **pdl_args(),
    )
    return False


def launch_sample_per_row(out, logits, inv_temperature, top_k, top_p, seed, counter):
    n, vocab = logits.shape
    if n == 0:
        return
    rows, block, warps = _tiles(n, vocab)
    _sample_per_row_kernel[(triton.cdiv(n, rows),)](
        out, logits, inv_temperature, top_k, top_p, seed, counter, n, vocab, logits.stride(0),
        ROWS=rows, BLOCK=block, num_warps=warps, **pdl_args(),
    )
