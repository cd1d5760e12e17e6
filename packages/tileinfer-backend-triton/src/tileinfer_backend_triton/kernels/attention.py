"""Paged grouped-query attention: one FlashAttention-2 style kernel for decode and prefill steps,
with flash-decoding's split-KV, and the kernel that combines the splits.

A program owns one (sequence, kv head), BLOCK_Q query rows and (split-KV) one chunk of the cached
positions. The GQA group is packed into the tile's M dimension: tile row ``r`` is query row
``r // group`` at head ``kv_head * group + r % group``, so each K/V page is read once per group.
Position j lives at offset ``j % page_size`` of page ``block_table[b, j // page_size]``;
positions past a sequence's context are masked, never read. Online softmax in float32 with exp2
(log2(e) folded into the scale); P rounded to the activation dtype for P @ V.

Steps of up to ROW_INVARIANT_MAX_Q rows per sequence run one row per program, each deriving its
split partition from its own visible length, so a verify row equals the decode step of that row
bit for bit. Batch-invariant steps (``AttentionStep.batch_invariant``) run every row that way,
prefill rows too, with splits of a fixed INVARIANT_CHUNK positions and the combine's reduction
over a fixed INVARIANT_SPLITS_PAD: a row's result then depends on its query and the keys it
sees only. INT8 pages: key smoothing is folded into the query (kept as a bf16 hi + lo pair),
the key scale multiplies the scores, the value scale the probabilities. A sliding window
(``attention_window``: WINDOW > 0) masks the positions before ``pos - WINDOW + 1`` and starts a
program's loop at the first block its rows can see (the blocks skipped would change nothing).
docs/triton-kernels.md has the design and its reasons.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (INTERPRET_MODE, cast_to, cdiv, int8_to, mma, next_pow2, pdl_args,
                     pdl_launch_dependents, pdl_wait, sm_count)

LOG2E = 1.4426950408889634
# Split-KV is considered for steps of up to this many query rows per sequence (decode, verify).
SPLIT_MAX_Q = 16
# Up to this many query rows per sequence: one row per program, per-row splits (see above).
ROW_INVARIANT_MAX_Q = 8
# Workspace capacity: query rows (tokens) and splits per head; splits hold >= MIN_CHUNK positions.
SPLIT_MAX_TOKENS = 64
MAX_SPLITS = 64
MIN_CHUNK = 64
WORKSPACE_MIN_CHUNK = 64  # the workspace holds splits this short (benchmarks try others)
# Split-KV target in programs per SM, by INT8 pages (from benchmarks/ops.py's sweep: more splits
# shorten bf16 pages' long contexts; INT8 pages are bound by their conversions, not the bytes;
# benchmarks/RESULTS.md, 2026-11-30, "Triton PDL, the CUDA rows GEMV and split decode attention",
# "Triton decode attention sweep").
SPLITS_PER_SM = {False: 4, True: 2}
# Batch-invariant steps: positions per split (a multiple of every row tile's BLOCK_N), and the
# splits the combine's reduction tree always spans (so the longest context is their product).
INVARIANT_CHUNK = 256
INVARIANT_SPLITS_PAD = 128


class _InvariantWorkspace:
    """The split workspace of batch-invariant steps, per device: every row of any step may
    split, so it is sized by the steps' rows and contexts (the model's workspace holds at most
    SPLIT_MAX_TOKENS rows). It grows outside graph captures (a step always runs eagerly before
    its capture) and a grown-out buffer is kept, since captured graphs may still use it."""

    def __init__(self):
        self._by_device: dict = {}

    def get(self, device, tokens: int, heads: int, splits: int, head_dim: int) -> torch.Tensor:
        key = (device.type, device.index)
        buffers = self._by_device.setdefault(key, [])
        need = (tokens, heads, splits, head_dim + 2)
        if buffers and all(have >= want for have, want in zip(buffers[-1].shape, need)):
            return buffers[-1]
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("the batch-invariant attention workspace must grow during a CUDA "
                               "graph capture: run the step eagerly first")
        shape = tuple(max(want, have) for want, have in
                      zip(need, buffers[-1].shape if buffers else need))
        buffers.append(torch.empty(shape, dtype=torch.float32, device=device))
        return buffers[-1]


INVARIANT_WORKSPACE = _InvariantWorkspace()


@triton.jit
def _attention_kernel(
    out_ptr, q_ptr, k_cache, v_cache, k_scale, v_scale, k_smooth,
    cu_ptr, ctx_ptr, bt_ptr, ws_ptr,
    KVH, GROUP, D, qk_scale,
    s_qt, s_qh, s_ot, s_oh,
    s_cp, s_cs, s_ch, s_sp, s_ss, s_sh, s_bt,
    s_wt, s_wh, s_ws,
    CHUNK, WINDOW,
    PAGE: tl.constexpr, CAUSAL: tl.constexpr, INT8: tl.constexpr, SMOOTH: tl.constexpr,
    SPLIT: tl.constexpr, F32: tl.constexpr, ROW_SPLITS: tl.constexpr, MIN_CHUNK_C: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    """Grid: (batch * kv_heads, cdiv(max_query_len, BLOCK_Q), splits). CHUNK: positions per
    split; with ROW_SPLITS (BLOCK_Q = 1) the split target instead, each row's chunk being
    derived from its own visible length."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    pid_bg = tl.program_id(0)
    qb = tl.program_id(1)
    split = tl.program_id(2)
    b = pid_bg // KVH
    g = pid_bg % KVH
    q_start = tl.load(cu_ptr + b)
    q_len = tl.load(cu_ptr + b + 1) - q_start
    ctx = tl.load(ctx_ptr + b)

    r = tl.arange(0, BLOCK_M)
    q_row = qb * BLOCK_Q + r // GROUP  # query row within the sequence
    head = g * GROUP + r % GROUP
    row_ok = (r < BLOCK_Q * GROUP) & (q_row < q_len)
    pos = ctx - q_len + q_row  # the row's position: it sees 0..pos when causal
    tok = (q_start + tl.minimum(q_row, q_len - 1)).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q_ty: tl.constexpr = q_ptr.dtype.element_ty
    q = tl.load(q_ptr + tok[:, None] * s_qt + head[:, None] * s_qh + d[None, :],
                mask=row_ok[:, None] & dmask[None, :], other=0.0)
    if SMOOTH:  # fold the keys' smoothing into the query; keep float32 precision as hi + lo
        qs = q.to(tl.float32) * tl.load(k_smooth + g * D + d, mask=dmask, other=0.0)[None, :]
        if F32:
            q_hi = qs
            q_lo = qs * 0.0
        else:
            q_hi = cast_to(qs, q_ty)
            q_lo = cast_to(qs - q_hi.to(tl.float32), q_ty)
    else:
        q_hi = q
        q_lo = q

    if CAUSAL:  # the block's last row sees positions < kv_end
        kv_end = tl.minimum(ctx, ctx - q_len + tl.minimum(q_len, (qb + 1) * BLOCK_Q))
    else:
        kv_end = ctx
    if ROW_SPLITS:  # this row's own partition: a function of its visible length only
        n_split = tl.maximum(tl.minimum(CHUNK, tl.cdiv(kv_end, MIN_CHUNK_C)), 1)
        chunk = tl.cdiv(tl.cdiv(kv_end, n_split), BLOCK_N) * BLOCK_N
    else:
        chunk = CHUNK
    lo = split * chunk
    hi = tl.minimum(kv_end, lo + chunk)
    if WINDOW > 0:  # the block's first row sees positions from its pos - WINDOW + 1 on
        first = ctx - q_len + qb * BLOCK_Q - WINDOW + 1
        lo = tl.maximum(lo, tl.maximum(first, 0) // BLOCK_N * BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    table = bt_ptr + b.to(tl.int64) * s_bt
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        jm = j < hi
        page = tl.load(table + j // PAGE, mask=jm, other=0).to(tl.int64)
        slot = page * s_cp + (j % PAGE) * s_cs + g * s_ch
        kv_mask = jm[:, None] & dmask[None, :]
        k = tl.load(k_cache + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if INT8:
            k = int8_to(k, q_ty)
        s = mma(q_hi, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), F32)
        if SMOOTH:
            s = mma(q_lo, tl.trans(k), s, F32)
        scale_off = page * s_sp + (j % PAGE) * s_ss + g * s_sh
        if INT8:
            s = s * tl.load(k_scale + scale_off, mask=jm, other=0.0)[None, :]
        s = s * qk_scale
        # (rows, keys) from the start: a runtime WINDOW compiles both branches of its `if`,
        # whose results must have one shape.
        visible = tl.broadcast_to(jm[None, :], (BLOCK_M, BLOCK_N))
        if CAUSAL:
            visible = visible & (j[None, :] <= pos[:, None])
        if WINDOW > 0:
            visible = visible & (j[None, :] > pos[:, None] - WINDOW)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
        if INT8:
            p = p * tl.load(v_scale + scale_off, mask=jm, other=0.0)[None, :]
            v = int8_to(v, q_ty)
        if F32:
            acc = mma(p, v, acc * alpha[:, None], F32)
        else:
            acc = mma(cast_to(p, v.dtype), v, acc * alpha[:, None], F32)
        m_i = m_new

    if SPLIT:  # unnormalized partial + (max, sum) for _combine_kernel
        w = ws_ptr + tok * s_wt + head.to(tl.int64) * s_wh + split * s_ws
        tl.store(w[:, None] + d[None, :], acc, mask=row_ok[:, None] & dmask[None, :])
        tl.store(w + D, m_i, mask=row_ok)
        tl.store(w + D + 1, l_i, mask=row_ok)
    else:
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        optr = out_ptr + tok[:, None] * s_ot + head[:, None] * s_oh + d[None, :]
        tl.store(optr, cast_to(o, out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & dmask[None, :])


@triton.jit(do_not_specialize=["NUM_SPLITS"])  # one binary for every step's split count
def _combine_kernel(out_ptr, ws_ptr, NUM_SPLITS, D, s_ot, s_oh, s_wt, s_wh, s_ws,
                    SPLITS_PAD: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr):
    """Grid: (tokens, heads). out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s.
    SPLITS_PAD is the workspace's capacity (not the step's split count), so the reduction tree
    over the splits is the same in every step; missing and empty splits add exact zeros."""
    pdl_launch_dependents(PDL)
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, BLOCK_D)
    smask = s < NUM_SPLITS
    base = ws_ptr + t * s_wt + h * s_wh + s * s_ws
    m = tl.load(base + D, mask=smask, other=float("-inf"))
    l = tl.load(base + D + 1, mask=smask, other=0.0)
    m_max = tl.max(m, axis=0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_safe)
    total = tl.sum(w * l, axis=0)
    acc = tl.load(base[:, None] + d[None, :], mask=smask[:, None] & (d < D)[None, :], other=0.0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + t * s_ot + h * s_oh + d, cast_to(o, out_ptr.dtype.element_ty), mask=d < D)


# --- launch ------------------------------------------------------------------------------------


def workspace(num_tokens, num_heads, head_dim, max_context_len, device):
    """The split-KV workspace: float32 (tokens, heads, splits, head_dim + 2) holding each split's
    unnormalized output, running max and running sum. Its shape is its capacity: a step with more
    query rows than it holds, or a longer context than it was sized for, runs with fewer splits."""
    tokens = min(int(num_tokens), SPLIT_MAX_TOKENS)
    splits = min(MAX_SPLITS, cdiv(max(int(max_context_len), 1), WORKSPACE_MIN_CHUNK))
    if tokens <= 0 or splits <= 1:
        return None
    return torch.empty((tokens, num_heads, splits, head_dim + 2), dtype=torch.float32,
                       device=device)


def _tiles(max_query_len: int, group: int, head_dim: int, int8: bool = False):
    """(BLOCK_M, BLOCK_N, num_warps, num_stages). Decode / verify steps: the smallest tile that
    holds the step's (rows x group); prefill: 128-row tiles. Chosen so that no variant spills
    on sm_90 (packages/tileinfer-backend-triton/tools/compile_sm90.py prints registers)."""
    if INTERPRET_MODE:
        if max_query_len <= SPLIT_MAX_Q:
            block_m = min(max(next_pow2(max_query_len * group), 16), 64)
            return max(block_m, next_pow2(group)), 128, 4, 1
        return max(64, next_pow2(group)), 64, 4, 1
    if max_query_len <= SPLIT_MAX_Q:
        block_m = max(min(max(next_pow2(max_query_len * group), 16), 64), next_pow2(group))
        if block_m <= 16:
            return block_m, 128 if int8 else 64, 4, 3
        if block_m <= 32:
            return block_m, 64, 4, 2
        return block_m, 64, 8, 3
    block_m = max(128, next_pow2(group))
    if head_dim <= 64 and not int8:
        return block_m, 128, 8, 2
    return block_m, 64, 8, 3


def launch_attention(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q,
                     context_lens, block_table, max_query_len, max_context_len, scale, causal,
                     ws, tiles=None, splits=None, min_chunk=MIN_CHUNK, batch_invariant=False,
                     window=None):
    """tiles, splits, min_chunk: launch settings for benchmarks (defaults: _tiles,
    SPLITS_PER_SM, MIN_CHUNK). batch_invariant: the step's (see the module docstring). window:
    each row sees the last window positions up to its own (causal only); None: all."""
    n, heads, hd = q.shape
    if n == 0:
        return
    kv_heads, page = k_cache.shape[2], k_cache.shape[1]
    group = heads // kv_heads
    batch = cu_seqlens_q.shape[0] - 1
    max_q, max_ctx = max(int(max_query_len), 1), max(int(max_context_len), 1)
    int8 = k_cache.dtype == torch.int8
    f32 = q.dtype == torch.float32 or (not int8 and k_cache.dtype != q.dtype)
    if k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must have the same layout")
    if q.stride(2) != 1 or out.stride(2) != 1 or k_cache.stride(3) != 1:
        raise ValueError("attention: q, out and the caches need a contiguous head_dim")

    # Decode / verify steps, and every step of a batch-invariant one: the 1-row tiles, one query
    # row per program (row invariance).
    row_mode = batch_invariant or max_q <= ROW_INVARIANT_MAX_Q
    block_m, block_n, warps, stages = tiles or _tiles(1 if row_mode else max_q, group, hd, int8)
    block_q = 1 if row_mode else block_m // group
    q_blocks = cdiv(max_q, block_q)

    if batch_invariant:
        # Splits of INVARIANT_CHUNK positions from position 0, always combined (over the fixed
        # INVARIANT_SPLITS_PAD), in a workspace for every row of the step.
        num_splits, chunk, split = cdiv(max_ctx, INVARIANT_CHUNK), INVARIANT_CHUNK, True
        if num_splits > INVARIANT_SPLITS_PAD:
            raise ValueError(f"batch-invariant attention covers contexts of up to "
                             f"{INVARIANT_CHUNK * INVARIANT_SPLITS_PAD} positions, not {max_ctx}")
        ws = INVARIANT_WORKSPACE.get(q.device, n, heads, num_splits, hd)
        splits_pad = INVARIANT_SPLITS_PAD
    else:
        # Split-KV when the step is small (decode, verify) and the workspace can hold it.
        num_splits = 1
        fits = (ws is not None and max_q <= SPLIT_MAX_Q and n <= ws.shape[0]
                and heads <= ws.shape[1] and ws.shape[3] == hd + 2)
        if fits:
            # SPLITS_PER_SM programs per SM from the sequences' heads alone (row mode: never
            # from the rows).
            base = batch * kv_heads * (1 if row_mode else q_blocks)
            target = max(1, min(ws.shape[2], cdiv(SPLITS_PER_SM[int8] * sm_count(q.device), base)))
            if splits is not None:
                target = max(1, min(int(splits), ws.shape[2]))
            num_splits = min(target, cdiv(max_ctx, min_chunk))
        if row_mode:
            # The grid covers the longest row's splits; each program derives its row's partition
            # (kernel's ROW_SPLITS) from the target, so CHUNK carries the target.
            chunk = target if num_splits > 1 else 1
        elif num_splits > 1:
            chunk = cdiv(cdiv(max_ctx, num_splits), block_n) * block_n
            num_splits = cdiv(max_ctx, chunk)
        if num_splits <= 1:
            num_splits, chunk = 1, (1 if row_mode else 1 << 30)
        split = num_splits > 1
        splits_pad = next_pow2(ws.shape[2]) if split else 1
    if int8:
        s_sp, s_ss, s_sh = k_scale.stride()
    else:
        s_sp = s_ss = s_sh = 0
    wsp = ws if split else q
    s_wt, s_wh, s_ws = (ws.stride(0), ws.stride(1), ws.stride(2)) if split else (0, 0, 0)
    grid = (batch * kv_heads, q_blocks, num_splits)
    _attention_kernel[grid](
        out, q, k_cache, v_cache, k_scale if int8 else q, v_scale if int8 else q,
        k_smooth if k_smooth is not None else q, cu_seqlens_q, context_lens, block_table, wsp,
        kv_heads, group, hd, float(scale) * LOG2E,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), s_sp, s_ss, s_sh,
        block_table.stride(0), s_wt, s_wh, s_ws, chunk, int(window or 0),
        PAGE=page, CAUSAL=bool(causal), INT8=int8, SMOOTH=k_smooth is not None, SPLIT=split,
        F32=f32, ROW_SPLITS=row_mode and not batch_invariant, MIN_CHUNK_C=min_chunk,
        BLOCK_M=block_m, BLOCK_Q=block_q, BLOCK_N=block_n, BLOCK_D=next_pow2(hd),
        num_warps=warps, num_stages=stages, **pdl_args(),
    )
    if split:
        _combine_kernel[(n, heads)](
            out, ws, num_splits, hd, out.stride(0), out.stride(1), s_wt, s_wh, s_ws,
            SPLITS_PAD=splits_pad, BLOCK_D=next_pow2(hd), num_warps=4, **pdl_args(),
        )
