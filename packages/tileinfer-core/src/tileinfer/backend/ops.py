"""Allocating wrappers around the in-place ops, for users and tests.

``linear(x, w, backend="triton")`` allocates the output and calls the backend's in-place op.
The model's forward step never uses these: it calls its ``OpTable`` on preallocated buffers.
"""

from __future__ import annotations

import torch

from .registry import get_backend
from .types import AttentionStep


def embed(table, ids, backend="ref"):
    out = torch.empty(ids.shape[0], table.shape[1], dtype=table.dtype, device=table.device)
    get_backend(backend).embed(out, table, ids)
    return out


def rmsnorm(x, weight, eps, backend="ref"):
    out = torch.empty_like(x)
    get_backend(backend).rmsnorm(out, x, weight, eps)
    return out


def add_rmsnorm(residual, delta, weight, eps, backend="ref"):
    """Returns (updated residual, normalized); the input residual is not modified."""
    residual = residual.clone()
    out = torch.empty_like(residual)
    get_backend(backend).add_rmsnorm(residual, out, delta, weight, eps)
    return residual, out


def linear(x, weight, weight_scale=None, out_dtype=None, backend="ref", batch_invariant=True):
    out = torch.empty(x.shape[0], weight.shape[0], dtype=out_dtype or x.dtype, device=x.device)
    get_backend(backend).linear(out, x, weight, weight_scale, batch_invariant)
    return out


def linear_swiglu(x, weight, weight_scale=None, backend="ref", batch_invariant=True):
    inter = weight.shape[0] // 2
    out = torch.empty(x.shape[0], inter, dtype=x.dtype, device=x.device)
    gate_up = torch.empty(x.shape[0], 2 * inter, dtype=x.dtype, device=x.device)
    get_backend(backend).linear_swiglu(out, x, weight, weight_scale, gate_up, batch_invariant)
    return out


def linear_xielu(x, weight, weight_scale, xielu, backend="ref", batch_invariant=True):
    """xielu: an ``XIELUScalars``."""
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    get_backend(backend).linear_xielu(out, x, weight, weight_scale, xielu, batch_invariant)
    return out


def attention(q, kv, cu_seqlens_q, context_lens, block_table, scale, causal=True,
              max_context_len=None, backend="ref"):
    """Paged attention of q (n, heads, head_dim) over kv (a ``LayerKV``); positions and slots of
    the step are not needed by attention and are left empty."""
    ops = get_backend(backend)
    out = torch.empty_like(q)
    q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    max_query_len = int(q_lens.max()) if q_lens.numel() else 0
    max_context_len = max_context_len or block_table.shape[1] * kv.k_cache.shape[1]
    empty = torch.empty(0, dtype=torch.int32, device=q.device)
    step = AttentionStep(empty, empty.long(), cu_seqlens_q, context_lens, block_table,
                         max_query_len, max_context_len)
    workspace = ops.attention_workspace(q.shape[0], q.shape[1], q.shape[2], max_context_len,
                                        q.device)
    ops.attention(out, q, kv, step, scale, causal, workspace)
    return out


def sample_tokens(logits, params, seed, counter, with_probs=False, backend="ref"):
    """Token ids (n,) int32 (and the filtered distributions if with_probs)."""
    dev = logits.device
    out = torch.empty(logits.shape[0], dtype=torch.int32, device=dev)
    probs = torch.empty_like(logits, dtype=torch.float32) if with_probs else None
    get_backend(backend).sample_tokens(
        out, logits, params.temperature, params.top_k, params.top_p,
        torch.tensor([seed], dtype=torch.int64, device=dev),
        torch.tensor([counter], dtype=torch.int64, device=dev), probs)
    return (out, probs) if with_probs else out


def accept_tokens(logits, draft_ids, draft_probs, params, seed, counter, backend="ref"):
    dev = logits.device
    out = torch.empty(logits.shape[0], dtype=torch.int32, device=dev)
    get_backend(backend).accept_tokens(
        out, logits, draft_ids, draft_probs, params.temperature, params.top_k, params.top_p,
        torch.tensor([seed], dtype=torch.int64, device=dev),
        torch.tensor([counter], dtype=torch.int64, device=dev))
    return out
