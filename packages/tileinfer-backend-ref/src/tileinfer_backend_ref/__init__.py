"""The reference backend: every op of ``tileinfer.hookspecs`` in plain PyTorch, on CPU and CUDA.

It is the ground truth the other backends are tested against, so it is written to be obviously
right, not fast: float32 arithmetic, roundings where transformers rounds, one Python loop over the
sequences of a step in attention. Linear layers call ``F.linear`` on (out, in) weights exactly as
transformers does, so its results match transformers' bit for bit where the math is the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tileinfer.backend.registry import BackendInfo
from tileinfer.backend.hookspecs import hookimpl
from tileinfer.backend.sampling import SamplingParams, accept_rows, sample_rows


@hookimpl
def tileinfer_backend_info():
    return BackendInfo(
        name="ref", available=True, devices=("cpu", "cuda"),
        # Capturable on a GPU (attention takes its padded, sync-free form there), though its
        # ops allocate temporaries, which a capture takes from the graph's memory pool.
        graph_safe=True,
    )


@hookimpl
def embed(out, table, ids):
    torch.index_select(table, 0, ids.long(), out=out)


def _rms(x, weight, eps, out_dtype):
    xf = x.float()
    x_hat = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight.to(out_dtype) * x_hat.to(out_dtype)).to(out_dtype)


@hookimpl
def rmsnorm(out, x, weight, eps):
    out.copy_(_rms(x, weight, eps, out.dtype))


@hookimpl
def add_rmsnorm(residual, out, delta, weight, eps):
    residual.copy_((residual.float() + delta.float()).to(residual.dtype))
    out.copy_(_rms(residual, weight, eps, out.dtype))


def _matmul(x, weight, weight_scale):
    """x @ W.T in float32 for a float or an INT8 (per-output-channel scaled) weight."""
    if weight_scale is None:
        return F.linear(x, weight)  # x's dtype, float32 accumulation, as transformers
    y = F.linear(x.float(), weight.float())
    return y * weight_scale.float()


@hookimpl
def linear(out, x, weight, weight_scale):
    out.copy_(_matmul(x, weight, weight_scale).to(out.dtype))


def _silu_mul(gate, up, dtype):
    act = F.silu(gate.float()).to(dtype)
    return (act.float() * up.float()).to(dtype)


@hookimpl
def linear_swiglu(out, x, weight, weight_scale, gate_up):
    gate_up.copy_(_matmul(x, weight, weight_scale).to(gate_up.dtype))
    inter = out.shape[-1]
    out.copy_(_silu_mul(gate_up[:, :inter], gate_up[:, inter:], out.dtype))


@hookimpl
def silu_mul(out, gate_up):
    inter = out.shape[-1]
    out.copy_(_silu_mul(gate_up[:, :inter], gate_up[:, inter:], out.dtype))


def _xielu(x, alpha_p, alpha_n, beta, eps):
    xf = x.float()
    pos = alpha_p * xf * xf + beta * xf
    neg = (torch.expm1(torch.clamp(xf, max=eps)) - xf) * alpha_n + beta * xf
    return torch.where(xf > 0, pos, neg)


@hookimpl
def xielu(out, x, alpha_p, alpha_n, beta, eps):
    out.copy_(_xielu(x, alpha_p, alpha_n, beta, eps).to(out.dtype))


@hookimpl
def linear_xielu(out, x, weight, weight_scale, alpha_p, alpha_n, beta, eps):
    up = _matmul(x, weight, weight_scale).to(out.dtype)
    out.copy_(_xielu(up, alpha_p, alpha_n, beta, eps).to(out.dtype))


def _rope(x, cos, sin, positions):
    half = x.shape[-1] // 2
    c = cos[positions.long()][:, None, :]  # (n, 1, half)
    s = sin[positions.long()][:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


@hookimpl
def rope(out, x, cos, sin, positions):
    out.copy_(_rope(x, cos, sin, positions).to(out.dtype))


def _quantize_vectors(vec):
    """Per-vector symmetric INT8: vec (..., head_dim) float32 -> (int8 values, float32 scales)."""
    amax = vec.abs().amax(-1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(vec / scale[..., None]), -127, 127).to(torch.int8)
    return q, scale


def _write_pages(cache, scale_pool, vec, slots):
    page_size = cache.shape[1]
    page, offset = slots // page_size, slots % page_size
    if scale_pool is None:
        cache[page, offset] = vec.to(cache.dtype)
    else:
        q, scale = _quantize_vectors(vec.float())
        cache[page, offset] = q
        scale_pool[page, offset] = scale


@hookimpl
def store_kv(k_cache, v_cache, k_scale, v_scale, k_smooth, k, v, slots):
    slots = slots.long()
    keys = k.float() / k_smooth if k_smooth is not None else k
    _write_pages(k_cache, k_scale, keys, slots)
    _write_pages(v_cache, v_scale, v, slots)


@hookimpl
def attention_inputs(q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm, k_norm,
                     cos, sin, positions, slots, eps):
    n, heads, head_dim = q_out.shape
    kv_heads = k_cache.shape[2]
    qkv = qkv.view(n, heads + 2 * kv_heads, head_dim)
    q, k, v = qkv[:, :heads], qkv[:, heads:heads + kv_heads], qkv[:, heads + kv_heads:]
    if q_norm is not None:
        q = _rms(q, q_norm, eps, q.dtype)
    if k_norm is not None:
        k = _rms(k, k_norm, eps, k.dtype)
    q_out.copy_(_rope(q, cos, sin, positions).to(q_out.dtype))
    k = _rope(k, cos, sin, positions).to(qkv.dtype)
    store_kv(k_cache, v_cache, k_scale, v_scale, k_smooth, k, v, slots)


def _gather_context(cache, scale_pool, smooth, pages, length):
    """The first ``length`` cached vectors of a sequence: (length, kv_heads, head_dim) float32."""
    vec = cache[pages].flatten(0, 1)[:length].float()
    if scale_pool is not None:
        vec = vec * scale_pool[pages].flatten(0, 1)[:length, :, None]
    if smooth is not None:
        vec = vec * smooth
    return vec


@hookimpl
def attention_workspace(num_tokens, num_heads, head_dim, max_context_len, device):
    return None


@hookimpl
def attention(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q, context_lens,
              block_table, max_query_len, max_context_len, scale, causal, workspace):
    # On the CPU, a loop over the sequences reading their true lengths; on a GPU, the padded form,
    # which never reads a tensor's value on the host and so can be captured in a CUDA graph.
    attend = attention_per_sequence if q.device.type == "cpu" else attention_padded
    attend(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q, context_lens,
           block_table, max_query_len, scale, causal)


@hookimpl
def attention_with_inputs(out, q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm,
                          k_norm, cos, sin, positions, slots, eps, cu_seqlens_q, context_lens,
                          block_table, max_query_len, max_context_len, scale, causal, workspace):
    attention_inputs(q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm, k_norm, cos,
                     sin, positions, slots, eps)
    attention(out, q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q, context_lens,
              block_table, max_query_len, max_context_len, scale, causal, workspace)


def _visible(context_len, q_len, q_index, key_pos, causal):
    """Which cached positions a query sees: all of the context, or up to its own position."""
    visible = key_pos < context_len
    if causal:
        visible = visible & (key_pos <= context_len - q_len + q_index)
    return visible


def attention_per_sequence(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q,
                           context_lens, block_table, max_query_len, scale, causal):
    """Attention one sequence at a time, over exactly its cached positions."""
    heads, kv_heads, page_size = q.shape[1], k_cache.shape[2], k_cache.shape[1]
    group = heads // kv_heads
    starts, lengths = cu_seqlens_q.tolist(), context_lens.tolist()
    for b, ctx in enumerate(lengths):
        q_rows = q[starts[b]:starts[b + 1]].float()  # (q_len, heads, hd)
        q_len = q_rows.shape[0]
        if q_len == 0:
            continue
        pages = block_table[b, : (ctx + page_size - 1) // page_size].long()
        k = _gather_context(k_cache, k_scale, k_smooth, pages, ctx).repeat_interleave(group, 1)
        v = _gather_context(v_cache, v_scale, None, pages, ctx).repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q_rows, k) * scale  # (heads, q_len, ctx)
        key_pos = torch.arange(ctx, device=q.device)[None, :]
        q_index = torch.arange(q_len, device=q.device)[:, None]
        scores = scores.masked_fill(~_visible(ctx, q_len, q_index, key_pos, causal), float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[starts[b]:starts[b + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(out.dtype)


def attention_padded(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q,
                     context_lens, block_table, max_query_len, scale, causal):
    """The same attention with every sequence padded to max_query_len queries and to the block
    table's width of keys, masked: no host synchronization."""
    n, heads, hd = q.shape
    batch, kv_heads = context_lens.shape[0], k_cache.shape[2]
    group, dev = heads // kv_heads, q.device
    q_lens = (cu_seqlens_q[1:] - cu_seqlens_q[:-1]).long()
    seq_of_row = torch.repeat_interleave(torch.arange(batch, device=dev), q_lens, output_size=n)
    q_index = torch.arange(n, device=dev) - cu_seqlens_q[seq_of_row].long()
    padded_q = q.new_zeros((batch, max_query_len, heads, hd), dtype=torch.float32)
    padded_q[seq_of_row, q_index] = q.float()

    pages = block_table.long()  # (batch, max_pages); padding entries are masked below
    width = pages.shape[1] * k_cache.shape[1]
    keys = _gather_pages(k_cache, k_scale, pages, width)  # (batch, width, kv_heads, hd)
    values = _gather_pages(v_cache, v_scale, pages, width)
    if k_smooth is not None:
        keys = keys * k_smooth
    key_pos = torch.arange(width, device=dev)
    visible = _visible(context_lens.long()[:, None, None], q_lens[:, None, None],
                       torch.arange(max_query_len, device=dev)[None, :, None],
                       key_pos[None, None, :], causal)  # (batch, max_query_len, width)
    # Unused pages may hold any bits (NaN included): zero them so masked products stay 0.
    keys = torch.where(visible.any(1)[:, :, None, None], keys, 0.0).repeat_interleave(group, 2)
    values = torch.where(visible.any(1)[:, :, None, None], values, 0.0).repeat_interleave(group, 2)
    scores = torch.einsum("bqhd,bkhd->bhqk", padded_q, keys) * scale
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    # A padded query row sees nothing: give it a harmless row instead of NaN.
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    result = torch.einsum("bhqk,bkhd->bqhd", probs, values)
    out.copy_(result[seq_of_row, q_index].to(out.dtype))


def _gather_pages(cache, scale_pool, pages, width):
    """The pages of each sequence laid end to end: (batch, width, kv_heads, hd) float32."""
    vec = cache[pages].flatten(1, 2).float()
    if scale_pool is not None:
        vec = vec * scale_pool[pages].flatten(1, 2)[..., None]
    return vec


@hookimpl
def sample_tokens(out, logits, temperature, top_k, top_p, seed, counter, probs_out):
    params = SamplingParams(temperature, top_k, top_p)
    out.copy_(sample_rows(logits, params, seed, counter, probs_out))


@hookimpl
def accept_tokens(out, logits, draft_ids, draft_probs, temperature, top_k, top_p, seed, counter):
    params = SamplingParams(temperature, top_k, top_p)
    out.copy_(accept_rows(logits, draft_ids, draft_probs, params, seed, counter))
