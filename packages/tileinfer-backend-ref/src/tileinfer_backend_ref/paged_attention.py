"""Paged grouped-query attention in two forms that compute the same thing.

``attention_per_sequence`` loops over the step's sequences and reads their true lengths on the
host (the CPU's form: plainly right). ``attention_padded`` pads every sequence to
``step.max_query_len`` queries and to the block table's width of keys and masks: it never reads
a tensor on the host, so it can be captured in a CUDA graph (the GPU's form).
tests/tileinfer-backend-ref checks that the two agree.

Row invariance: in steps of up to ``ROW_INVARIANT_MAX_TOKENS`` query rows both forms compute
each row on its own, with the tensors a 1-token step of its sequence at that position would
use (per sequence: the keys up to its position; padded: one row against its sequence's padded
keys, masked past its position). A speculative verify step's rows then equal decode steps bit
for bit; summing a softmax or a product over more rows or more (masked) keys could round
differently. Batch-invariant steps (``AttentionStep.batch_invariant``) compute every row that
way at any row count: per sequence over exactly its keys on the CPU; on a GPU in fixed chunks
of keys (``_attention_rows_in_chunks``), since the padded width depends on the step.

``window`` (the ``attention_window`` op): a query at position p sees only the positions
``p - window + 1 .. p``, a mask more in every form; the padded form also gathers only the pages
the window reaches, not the block table's width.
"""

from __future__ import annotations

import torch

from .dense import ROW_INVARIANT_MAX_TOKENS


def _visible(context_len, q_len, q_index, key_pos, causal, window=None):
    """Which cached positions a query sees: all of the context, or up to its own position (and
    no further back than window positions)."""
    visible = key_pos < context_len
    if causal:
        own = context_len - q_len + q_index
        visible = visible & (key_pos <= own)
        if window is not None:
            visible = visible & (key_pos > own - window)
    return visible


def _gather_context(cache, scale_pool, smooth, pages, length):
    """The first ``length`` cached vectors of a sequence: (length, kv_heads, head_dim) float32."""
    vec = cache[pages].flatten(0, 1)[:length].float()
    if scale_pool is not None:
        vec = vec * scale_pool[pages].flatten(0, 1)[:length, :, None]
    if smooth is not None:
        vec = vec * smooth
    return vec


def _attend_rows(q_rows, k, v, group, scale):
    """Every row of q_rows (q_len, heads, hd) float32 over all of k, v (ctx, kv_heads, hd)."""
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q_rows, k) * scale  # (heads, q_len, ctx)
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)


def attention_per_sequence(out, q, kv, step, scale, causal, window=None):
    """Attention one sequence at a time, over exactly its cached positions (every row on its
    own in batch-invariant steps)."""
    heads, kv_heads, page_size = q.shape[1], kv.k_cache.shape[2], kv.k_cache.shape[1]
    group = heads // kv_heads
    row_by_row = q.shape[0] <= ROW_INVARIANT_MAX_TOKENS or step.batch_invariant
    starts, lengths = step.cu_seqlens_q.tolist(), step.context_lens.tolist()
    for b, ctx in enumerate(lengths):
        q_rows = q[starts[b]:starts[b + 1]].float()  # (q_len, heads, hd)
        q_len = q_rows.shape[0]
        if q_len == 0:
            continue
        pages = step.block_table[b, : (ctx + page_size - 1) // page_size].long()
        k = _gather_context(kv.k_cache, kv.k_scale, kv.k_smooth, pages, ctx)
        v = _gather_context(kv.v_cache, kv.v_scale, None, pages, ctx)
        if row_by_row:  # row i as a 1-token step at its position: the keys up to it, no mask
            for i in range(q_len):
                seen = ctx - q_len + i + 1 if causal else ctx
                first = max(0, seen - window) if window is not None else 0
                row = _attend_rows(q_rows[i:i + 1].clone(), k[first:seen].clone(),
                                   v[first:seen].clone(), group, scale)
                out[starts[b] + i:starts[b] + i + 1] = row.to(out.dtype)
            continue
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q_rows, k) * scale  # (heads, q_len, ctx)
        key_pos = torch.arange(ctx, device=q.device)[None, :]
        q_index = torch.arange(q_len, device=q.device)[:, None]
        scores = scores.masked_fill(~_visible(ctx, q_len, q_index, key_pos, causal, window),
                                    float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[starts[b]:starts[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype)


def _gather_pages(cache, scale_pool, pages):
    """The pages of each sequence laid end to end: (batch, width, kv_heads, hd) float32."""
    vec = cache[pages].flatten(1, 2).float()
    if scale_pool is not None:
        vec = vec * scale_pool[pages].flatten(1, 2)[..., None]
    return vec


def _keys_and_values(kv, pages):
    """The keys (smoothing applied) and values of each sequence's pages (b, max_pages) laid end
    to end: two (b, width, kv_heads, hd) float32 tensors."""
    keys = _gather_pages(kv.k_cache, kv.k_scale, pages)
    if kv.k_smooth is not None:
        keys = keys * kv.k_smooth
    return keys, _gather_pages(kv.v_cache, kv.v_scale, pages)


def _pages_from(pages, first_position, count: int, page_size: int):
    """Of each sequence's pages (b, max_pages), the ``count`` consecutive ones from the page of
    first_position (b,) (moved back where they would pass the table's end), and their positions
    (b, count * page_size): a fixed shape read on the device, so a CUDA graph captures it.
    A window's worth of keys instead of the block table's width."""
    max_pages = pages.shape[1]
    first = torch.clamp(torch.div(first_position, page_size, rounding_mode="floor"),
                        min=0, max=max_pages - count)
    index = first[:, None] + torch.arange(count, device=pages.device)  # (b, count)
    positions = index[:, :, None] * page_size + torch.arange(page_size, device=pages.device)
    return pages.gather(1, index), positions.flatten(1)


def _window_count(max_pages: int, span: int, page_size: int) -> int:
    """Pages that hold any span consecutive positions (at most the table's)."""
    return min(max_pages, span // page_size + 2)


def _attention_padded_rows(out, q, kv, step, scale, causal, seq_of_row, q_index, q_lens,
                           window):
    """Each query row alone against its sequence's padded keys (a batch of one), masked past
    its position and zeroed where masked, exactly as a 1-token step at that position."""
    n, heads, hd = q.shape
    group, page_size = heads // kv.k_cache.shape[2], kv.k_cache.shape[1]
    ctx = step.context_lens.long()[seq_of_row]  # (n,)
    last = ctx - q_lens[seq_of_row] + q_index if causal else ctx - 1  # last position each sees
    pages = step.block_table[seq_of_row].long()  # (n, max_pages): each row's sequence's pages
    key_pos = torch.arange(pages.shape[1] * page_size, device=q.device).expand(n, -1)
    if window is not None:  # only the pages each row's window reaches
        count = _window_count(pages.shape[1], window, page_size)
        pages, key_pos = _pages_from(pages, last - window + 1, count, page_size)
    for r in range(n):
        keys, values = _keys_and_values(kv, pages[r:r + 1])
        row_pos = key_pos[r]  # (keys,)
        visible = (row_pos <= last[r:r + 1]) & (row_pos < ctx[r:r + 1])
        if window is not None:
            visible = visible & (row_pos > last[r:r + 1] - window)
        seen = visible[None, :, None, None]
        keys = torch.where(seen, keys, 0.0).repeat_interleave(group, 2)
        values = torch.where(seen, values, 0.0).repeat_interleave(group, 2)
        q_row = q[r:r + 1].float().clone()[None]  # (1, 1, heads, hd), a tensor of its own
        scores = torch.einsum("bqhd,bkhd->bhqk", q_row, keys) * scale
        scores = scores.masked_fill(~visible[None, None, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[r:r + 1] = torch.einsum("bhqk,bkhd->bqhd", probs, values)[0].to(out.dtype)


# Batch-invariant steps on a GPU: every row over its keys in chunks of this many positions from
# position 0 (the block table's width padded to a multiple), combined in chunk order.
INVARIANT_CHUNK = 256


def _attention_rows_in_chunks(out, q, kv, step, scale, causal, seq_of_row, q_index, q_lens,
                              window):
    """Each query row alone, over fixed chunks of INVARIANT_CHUNK key positions: every product
    and reduction has the same shape whatever the step holds (the block table's width, the other
    rows), so a row gets the same bits alone and in any step; with no host synchronization.
    Chunks past a row's keys leave its running (max, sum, output) exactly as they were."""
    n, heads, hd = q.shape
    group = heads // kv.k_cache.shape[2]
    width = step.block_table.shape[1] * kv.k_cache.shape[1]
    padded = -(-width // INVARIANT_CHUNK) * INVARIANT_CHUNK
    key_pos = torch.arange(padded, device=q.device)
    ctx = step.context_lens.long()[seq_of_row]  # (n,)
    last = ctx - q_lens[seq_of_row] + q_index if causal else ctx - 1  # last position each sees
    for r in range(n):
        pages = step.block_table[seq_of_row[r:r + 1]].long()  # (1, max_pages)
        keys, values = (t[0] for t in _keys_and_values(kv, pages))
        keys = torch.nn.functional.pad(keys, (0, 0, 0, 0, 0, padded - width))
        values = torch.nn.functional.pad(values, (0, 0, 0, 0, 0, padded - width))
        visible = (key_pos <= last[r]) & (key_pos < ctx[r])  # (padded,)
        if window is not None:
            visible = visible & (key_pos > last[r] - window)
        seen = visible[:, None, None]
        keys = torch.where(seen, keys, 0.0).repeat_interleave(group, 1)  # (padded, heads, hd)
        values = torch.where(seen, values, 0.0).repeat_interleave(group, 1)
        q_row = q[r].float().clone()  # (heads, hd), a tensor of its own
        run_max = run_sum = run_out = None
        for start in range(0, padded, INVARIANT_CHUNK):
            chunk = slice(start, start + INVARIANT_CHUNK)
            scores = torch.einsum("hd,khd->hk", q_row, keys[chunk]) * scale
            scores = scores.masked_fill(~visible[chunk][None, :], float("-inf"))
            m = scores.amax(-1)  # (heads,): -inf where the chunk holds none of the row's keys
            has_keys = torch.isfinite(m)
            p = torch.exp(scores - torch.where(has_keys, m, 0.0)[:, None])  # 0 where masked
            l, o = p.sum(-1), torch.einsum("hk,khd->hd", p, values[chunk])
            if run_max is None:
                run_max, run_sum, run_out = m, l, o
                continue
            new_max = torch.maximum(run_max, m)
            base = torch.where(torch.isfinite(new_max), new_max, 0.0)
            a, b = torch.exp(run_max - base), torch.exp(m - base)
            run_sum = torch.where(has_keys, run_sum * a + l * b, run_sum)
            run_out = torch.where(has_keys[:, None], run_out * a[:, None] + o * b[:, None],
                                  run_out)
            run_max = new_max
        result = torch.where(run_sum[:, None] > 0, run_out / run_sum[:, None], 0.0)
        out[r:r + 1] = result[None].to(out.dtype)


def attention_padded(out, q, kv, step, scale, causal, window=None):
    """The same attention with every sequence padded to max_query_len queries and to the block
    table's width of keys, masked: no host synchronization."""
    n, heads, hd = q.shape
    batch, kv_heads = step.batch, kv.k_cache.shape[2]
    group, dev, max_q = heads // kv_heads, q.device, step.max_query_len
    cu = step.cu_seqlens_q
    q_lens = (cu[1:] - cu[:-1]).long()
    seq_of_row = torch.repeat_interleave(torch.arange(batch, device=dev), q_lens, output_size=n)
    q_index = torch.arange(n, device=dev) - cu[seq_of_row].long()
    rows = (seq_of_row, q_index, q_lens, window)
    if step.batch_invariant:
        _attention_rows_in_chunks(out, q, kv, step, scale, causal, *rows)
        return
    if n <= ROW_INVARIANT_MAX_TOKENS:
        _attention_padded_rows(out, q, kv, step, scale, causal, *rows)
        return
    padded_q = q.new_zeros((batch, max_q, heads, hd), dtype=torch.float32)
    padded_q[seq_of_row, q_index] = q.float()

    pages = step.block_table.long()  # (batch, max_pages); padding entries are masked below
    page_size = kv.k_cache.shape[1]
    key_pos = torch.arange(pages.shape[1] * page_size, device=dev)[None]  # (1, width)
    if window is not None and causal:  # the pages from the first query's window on
        count = _window_count(pages.shape[1], max_q + window - 1, page_size)
        first = step.context_lens.long() - q_lens - window + 1  # (batch,)
        pages, key_pos = _pages_from(pages, first, count, page_size)  # key_pos (batch, keys)
    keys, values = _keys_and_values(kv, pages)  # (batch, keys, kv_heads, hd)
    visible = _visible(step.context_lens.long()[:, None, None], q_lens[:, None, None],
                       torch.arange(max_q, device=dev)[None, :, None],
                       key_pos[:, None, :], causal, window)  # (batch, max_q, keys)
    # Unused pages may hold any bits (NaN included): zero them so masked products stay 0.
    used = visible.any(1)[:, :, None, None]
    keys = torch.where(used, keys, 0.0).repeat_interleave(group, 2)
    values = torch.where(used, values, 0.0).repeat_interleave(group, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", padded_q, keys) * scale
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    # A padded query row sees nothing: give it a harmless row instead of NaN.
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    result = torch.einsum("bhqk,bkhd->bqhd", probs, values)
    out.copy_(result[seq_of_row, q_index].to(out.dtype))
