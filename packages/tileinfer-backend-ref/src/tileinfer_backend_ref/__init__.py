"""The reference backend: every op of ``tileinfer.backend.hookspecs`` in plain PyTorch, on CPU
and CUDA.

It is the ground truth the other backends are tested against, so it is written to be obviously
right, not fast: float32 arithmetic, roundings where transformers rounds, one Python loop over the
sequences of a step in attention (on the CPU). Linear layers call ``F.linear`` on (out, in)
weights exactly as transformers does, so its results match transformers' bit for bit where the
math is the same. Steps of up to ``dense.ROW_INVARIANT_MAX_TOKENS`` rows compute each row on
its own, as a 1-token step would: a speculative verify step's rows then equal decode steps bit
for bit (tests/tileinfer-backend-ref checks it). Batch-invariant steps (``Invariance.BATCH``,
``AttentionStep.batch_invariant``) compute linear rows in blocks of ``dense.ROW_BLOCK`` and
attention a row at a time at any row count (docs/determinism.md).

The ops are the thin wrappers below; the math is in ``dense`` (norms, products, activations),
``kv`` (RoPE, the paged KV store) and ``paged_attention``. It does not implement the optional
``attention_with_inputs`` (the model then calls ``attention_inputs`` and ``attention``). Its
e4m3-input ops (``add_rmsnorm_e4m3`` and the linear ops of a quantized input) define theirs:
``add_rmsnorm`` then ``quantize_rows``, and the FP8 product of the given e4m3 rows.
"""

from __future__ import annotations

import torch

from tileinfer.backend import BackendInfo, hookimpl
from tileinfer.backend.hookspecs import Invariance
from tileinfer.backend import sampling as _sampling
from tileinfer.backend.fp8 import fp8_matmul_quantized, quantize_rows
from tileinfer.backend.sampling import SamplingParams, accept_rows, sample_rows

from .dense import matmul, quantized_rows, rms, row_blocks, rows_of
from .dense import silu_mul as _silu_mul
from .dense import xielu as _xielu
from .kv import rope as _rope
from .kv import store_kv as _store_kv
from .paged_attention import attention_padded, attention_per_sequence


@hookimpl
def tileinfer_backend_info():
    return BackendInfo(
        name="ref", available=True, devices=("cpu", "cuda"),
        # Capturable on a GPU (attention takes its padded, sync-free form there), though its
        # ops allocate temporaries, which a capture takes from the graph's memory pool.
        graph_safe=True,
        # linear: blocks of dense.ROW_BLOCK rows; attention: a row at a time (paged_attention).
        batch_invariant=True,
        fp8=True,
        fp8_weight_only=True,
    )


@hookimpl
def embed(out, table, ids):
    torch.index_select(table, 0, ids.long(), out=out)


def _rms_rows(x, weight, eps, out_dtype):
    return torch.cat([rms(block, weight, eps, out_dtype)[: r.stop - r.start]
                      for r, block in row_blocks(x)])


@hookimpl
def rmsnorm(out, x, weight, eps):
    # In blocks of ROW_BLOCK rows at any row count: the op has no batch_invariant flag, and a
    # reduction over more rows may sum each row in another order (on a GPU).
    for r, block in row_blocks(x):
        out[r].copy_(rms(block, weight, eps, out.dtype)[: r.stop - r.start])


@hookimpl
def add_rmsnorm(residual, out, delta, weight, eps):
    residual.copy_((residual.float() + delta.float()).to(residual.dtype))
    rmsnorm(out, residual, weight, eps)


def _rows(x, batch_invariant):
    """rows_of(x) for the linear contract's batch_invariant: up to ROW_INVARIANT_MAX_TOKENS rows
    one at a time (STEPS, and NONE: invariant either way), blocks at any count for BATCH."""
    return rows_of(x, invariant=batch_invariant == Invariance.BATCH)


@hookimpl
def linear(out, x, weight, weight_scale, batch_invariant=True):
    for r, xr in _rows(x, batch_invariant):
        n = r.stop - r.start
        out[r].copy_(matmul(xr, weight, weight_scale, out.dtype)[:n].to(out.dtype))


@hookimpl
def linear_swiglu(out, x, weight, weight_scale, gate_up, batch_invariant=True):
    for r, xr in _rows(x, batch_invariant):
        n = r.stop - r.start
        gate_up[r].copy_(matmul(xr, weight, weight_scale)[:n].to(gate_up.dtype))
    inter = out.shape[-1]
    out.copy_(_silu_mul(gate_up[:, :inter], gate_up[:, inter:], out.dtype))


@hookimpl
def linear_xielu(out, x, weight, weight_scale, xielu, batch_invariant=True):
    for r, xr in _rows(x, batch_invariant):
        up = matmul(xr, weight, weight_scale)[: r.stop - r.start].to(out.dtype)
        out[r].copy_(_xielu(up, xielu).to(out.dtype))


@hookimpl
def add_rmsnorm_e4m3(residual, out, out_q, out_scale, delta, weight, eps):
    add_rmsnorm(residual, out, delta, weight, eps)
    q, scale = quantize_rows(out)
    out_q.copy_(q)
    out_scale.copy_(scale)


def _e4m3_product(x_q, x_scale, weight, weight_scale, batch_invariant):
    """(row range, float32 product) pairs of the rows linear would compute for the input whose
    quantization is (x_q, x_scale): the same row ranges and shapes, so the same bits."""
    return [(r, fp8_matmul_quantized(q, s, weight, weight_scale)[: r.stop - r.start])
            for r, q, s in quantized_rows(x_q, x_scale, batch_invariant == Invariance.BATCH)]


@hookimpl
def linear_e4m3_input(out, x_q, x_scale, weight, weight_scale, batch_invariant=True):
    for r, product in _e4m3_product(x_q, x_scale, weight, weight_scale, batch_invariant):
        out[r].copy_(product.to(out.dtype))


@hookimpl
def linear_swiglu_e4m3_input(out, x_q, x_scale, weight, weight_scale, gate_up,
                             batch_invariant=True):
    for r, product in _e4m3_product(x_q, x_scale, weight, weight_scale, batch_invariant):
        gate_up[r].copy_(product.to(gate_up.dtype))
    inter = out.shape[-1]
    out.copy_(_silu_mul(gate_up[:, :inter], gate_up[:, inter:], out.dtype))


@hookimpl
def attention_inputs(q_out, kv, qkv, qk, step):
    n, heads, head_dim = q_out.shape
    kv_heads = kv.k_cache.shape[2]
    qkv = qkv.view(n, heads + 2 * kv_heads, head_dim)
    q, k, v = qkv[:, :heads], qkv[:, heads:heads + kv_heads], qkv[:, heads + kv_heads:]
    if qk.q_norm is not None:
        q = _rms_rows(q, qk.q_norm, qk.norm_eps, q.dtype)
    if qk.k_norm is not None:
        k = _rms_rows(k, qk.k_norm, qk.norm_eps, k.dtype)
    q_out.copy_(_rope(q, qk.cos, qk.sin, step.positions).to(q_out.dtype))
    k = _rope(k, qk.cos, qk.sin, step.positions).to(qkv.dtype)
    _store_kv(kv, k, v, step.slots)


@hookimpl
def attention_workspace(num_tokens, num_heads, head_dim, max_context_len, device):
    return None


@hookimpl
def attention(out, q, kv, step, scale, causal, workspace):
    # On the CPU, a loop over the sequences reading their true lengths; on a GPU, the padded form,
    # which never reads a tensor's value on the host and so can be captured in a CUDA graph.
    attend = attention_per_sequence if q.device.type == "cpu" else attention_padded
    attend(out, q, kv, step, scale, causal)


@hookimpl
def attention_window(out, q, kv, step, scale, window, workspace):
    attend = attention_per_sequence if q.device.type == "cpu" else attention_padded
    attend(out, q, kv, step, scale, True, window)


@hookimpl
def reserve_scratch(device):
    return None  # the ref backend keeps no scratch


@hookimpl
def sample_tokens(out, logits, temperature, top_k, top_p, seed, counter, probs_out):
    params = SamplingParams(temperature, top_k, top_p)
    out.copy_(sample_rows(logits, params, seed, counter, probs_out))


@hookimpl
def sample_tokens_with_sums(out, sums, logits, temperature, top_k, top_p, seed, counter):
    sample_tokens(out, logits, temperature, top_k, top_p, seed, counter, None)
    torch.sum(logits, dim=1, out=sums)


@hookimpl
def sample_per_row(out, logits, inv_temperature, top_k, top_p, seed, counter):
    out.copy_(_sampling.sample_per_row(logits, inv_temperature, top_k, top_p, seed, counter))


@hookimpl
def accept_tokens(out, logits, draft_ids, draft_probs, temperature, top_k, top_p, seed, counter):
    params = SamplingParams(temperature, top_k, top_p)
    out.copy_(accept_rows(logits, draft_ids, draft_probs, params, seed, counter))
