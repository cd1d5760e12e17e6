"""The small typed objects that ops take instead of long positional lists.

They hold tensors (and a few host-side ints), never copies: a model builds them once per step or
per layer from its static buffers, so a step that passes them stays capturable in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LayerKV:
    """One layer's KV pages.

    k_cache, v_cache: (num_pages, page_size, kv_heads, head_dim); cache slot ``s`` is offset
    ``s % page_size`` of page ``s // page_size``. With an INT8 cache they are int8 and k_scale,
    v_scale (num_pages, page_size, kv_heads) float32 hold one scale per cached vector; k_smooth
    (kv_heads, head_dim) float32 are per-channel key smoothing factors (or None):
    ``key ~= k_smooth * k_scale[..., None] * k_cache``. With a float cache the three are None.
    """

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    k_smooth: torch.Tensor | None = None

    @property
    def int8(self) -> bool:
        return self.k_scale is not None


@dataclass(frozen=True)
class AttentionStep:
    """The attention ops' view of a step of one or more sequences, flattened along the tokens.

    positions (n,) int32 and slots (n,) int64: each new token's position and cache slot.
    cu_seqlens_q (batch + 1,) int32: sequence b owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``,
    the *last* q_len_b of its ``context_lens[b]`` (batch,) int32 cached positions.
    block_table (batch, max_pages) int32: each sequence's pages in position order; entries past
    its pages are padding and must not be read.
    max_query_len, max_context_len: host-side upper bounds (Python ints) of the query and context
    lengths, for choosing launch grids; the true lengths are in the tensors.
    batch_invariant: each query row's result must be the same bits whatever else the step holds
    (other rows and sequences, the bounds above) and however its keys were written (one prefill,
    chunks, decode steps): set for a model loaded with ``batch_invariant=True``, whose backend
    declares ``BackendInfo.batch_invariant``.
    """

    positions: torch.Tensor
    slots: torch.Tensor
    cu_seqlens_q: torch.Tensor
    context_lens: torch.Tensor
    block_table: torch.Tensor
    max_query_len: int
    max_context_len: int
    batch_invariant: bool = False

    @property
    def batch(self) -> int:
        return self.context_lens.shape[0]


@dataclass(frozen=True)
class QKTransform:
    """What happens to queries and keys between the q/k/v projection and attention.

    q_norm, k_norm: (head_dim,) weights of the per-head RMSNorm of Qwen3 and Apertus, or None;
    norm_eps: its epsilon. cos, sin: (max_len, head_dim // 2) float32 RoPE tables, row p for
    position p, applied with the "rotate half" pairing (with h = head_dim // 2, c = cos[p, i],
    s = sin[p, i]: ``x'[i] = x[i] c - x[i + h] s``, ``x'[i + h] = x[i + h] c + x[i] s``).
    """

    cos: torch.Tensor
    sin: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    norm_eps: float = 1e-6


@dataclass(frozen=True)
class XIELUScalars:
    """The effective scalars of one layer's xIELU activation (arXiv:2411.13010), as floats.

    transformers' ``XIELUActivation`` holds alpha_p, alpha_n, beta and eps in the model dtype and
    applies ``softplus(alpha_p)`` and ``beta + softplus(alpha_n)``, each rounded to that dtype;
    these are those rounded values. ``xielu(x) = x > 0 ? alpha_p x^2 + beta x
    : (expm1(min(x, eps)) - x) alpha_n + beta x``.
    """

    alpha_p: float
    alpha_n: float
    beta: float
    eps: float
