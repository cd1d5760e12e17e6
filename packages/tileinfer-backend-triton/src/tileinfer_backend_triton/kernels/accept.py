"""The p/q acceptance rule of speculative sampling on the device (``accept_tokens``), token for
token as ``tileinfer.backend.sampling``: accept draft d if u * q[d] < p[d], else a Gumbel-max
sample of max(p - q, 0), with p filtered as sampling_common.py filters it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import exact_exp, exact_log, pdl_args, pdl_launch_dependents, pdl_wait
from .rng import ACCEPT_SALT
from .rng import gumbel as _gumbel
from .rng import stream_key as _stream_key
from .rng import uniform as _uniform
from .sampling_common import _argmax_update, _filter, _flags, _greedy, _order_key, _scores, _tiles


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
