"""The op contract: one pluggy hookspec per op that the model or the speculative path calls.

A backend is a plugin (a module or an object) registered under the entry-point group ``tileinfer``.
It implements ``tileinfer_backend_info`` and any subset of the ops below with ``@hookimpl``
functions of the same names and argument names. Ops it lacks fall back to the ``ref`` backend,
except ``attention_with_inputs``, ``sample_per_row``, ``sample_tokens_with_sums``,
``gemma_rmsnorm``, ``add_gemma_rmsnorm`` and the three e4m3-input ops (``add_rmsnorm_e4m3``,
``linear_e4m3_input``, ``linear_swiglu_e4m3_input``), which are optional
(docs/writing-a-backend.md).

Conventions shared by every op (docs/architecture.md has the reasons):

- Shapes are PyTorch's row-major shapes: hidden states ``(tokens, hidden)``, per-head tensors
  ``(tokens, heads, head_dim)``, linear weights ``(out_features, in_features)`` as in safetensors.
- Every op is *in place*: it writes its result into preallocated tensors (``out`` and the others
  named in its docstring), returns nothing, allocates no device memory (scratch is made by
  ``attention_workspace`` and ``reserve_scratch``) and never synchronizes with the host, so that a
  whole step can be captured in a CUDA graph. ``tileinfer.backend.ops`` has allocating wrappers.
- Activations are ``bfloat16`` (or ``float16``/``float32``); arithmetic is done in float32 and
  rounded to the activation dtype where transformers rounds, so greedy tokens match it.
- Token ids, positions, context lengths and block tables are ``int32``; cache slots are ``int64``.
- The grouped arguments are the frozen dataclasses of ``tileinfer.backend.types``: ``LayerKV``
  (one layer's pages), ``AttentionStep`` (the step's positions, slots and block tables),
  ``QKTransform`` (q/k norms and RoPE tables), ``XIELUScalars``.
"""

from __future__ import annotations

import enum

import pluggy

hookspec = pluggy.HookspecMarker("tileinfer")
hookimpl = pluggy.HookimplMarker("tileinfer")

# Sampling filters keep at most this many candidates when top_k > 0 is requested.
MAX_TOP_K = 1024
# The largest step whose rows ``batch_invariant=True`` keeps bit-identical to 1-row steps: a
# speculative verify step (the last token and up to 7 drafts).
INVARIANT_MAX_ROWS = 8


class Invariance(enum.IntEnum):
    """The values of the linear ops' ``batch_invariant`` (``False`` and ``True`` are the first
    two, so a backend may test it as a bool).

    NONE (False): the step's rows are separate sequences; any kernel for n rows.
    STEPS (True): up to ``INVARIANT_MAX_ROWS`` rows, each row the same bits as in a step of that
    row alone (a single sequence's steps: a speculative verify row against a decode step).
    BATCH: every row the same bits whatever the step holds besides it (any number of rows, its
    place among them, the other rows' values): the batch-invariant mode of a model loaded with
    ``batch_invariant=True`` (docs/determinism.md). Only backends whose ``BackendInfo`` says
    ``batch_invariant=True`` are given it; to any other, it would mean STEPS.
    """

    NONE = 0
    STEPS = 1
    BATCH = 2


@hookspec
def tileinfer_backend_info():
    """Describe this backend: return a ``tileinfer.backend.BackendInfo``.

    Called once when the plugin is loaded. ``available`` says whether it can run on this machine,
    and ``reason`` why not (e.g. "no CUDA GPU").
    """


@hookspec
def embed(out, table, ids):
    """Embedding lookup.

    table: (vocab, hidden); ids: (n,) int32, 0-based; out: (n, hidden), ``out[i] = table[ids[i]]``.
    """


@hookspec
def rmsnorm(out, x, weight, eps):
    """RMS normalization over the last dimension.

    x: (..., dim), e.g. (n, hidden) or (n, heads, head_dim); weight: (dim,); out: like x.
    In float32: ``x_hat = x * rsqrt(mean(x**2) + eps)``, rounded to x's dtype, then
    ``out = weight * x_hat`` rounded to out's dtype (the two roundings of transformers' LlamaRMSNorm).
    """


@hookspec
def add_rmsnorm(residual, out, delta, weight, eps):
    """Residual update and RMS normalization in one op.

    residual, delta, out: (n, hidden). First ``residual += delta`` (rounded to residual's dtype),
    then ``out = rmsnorm(residual, weight, eps)`` as in ``rmsnorm``. Writes residual and out.
    """


@hookspec
def gemma_rmsnorm(out, x, weight, eps):
    """Gemma's RMS normalization (optional: without it the model runs torch ops).

    x: (..., dim), e.g. (n, hidden) or a view (n, heads, head_dim); weight: (dim,) float32,
    ``1 + w`` as the loader stores Gemma's; out: like x, and may be x itself. In float32:
    ``out = x * rsqrt(mean(x**2) + eps) * weight``, rounded once to out's dtype (transformers'
    Gemma3RMSNorm). Each row is computed on its own: its bits do not depend on the other rows.
    """


@hookspec
def add_gemma_rmsnorm(residual, out, delta, weight, eps):
    """``residual += delta`` (rounded to residual's dtype), then ``gemma_rmsnorm(out, residual,
    weight, eps)`` (optional, with ``gemma_rmsnorm``). Writes residual and out.
    """


@hookspec
def linear(out, x, weight, weight_scale, batch_invariant):
    """``out = x @ weight.T``.

    x: (n, in); weight: (out_features, in), same dtype as x, or int8 with weight_scale
    (out_features,) float32 meaning ``W[j, :] = weight_scale[j] * weight[j, :]`` (weight_scale is
    None for a float weight), or float8_e4m3fn with weight_scale likewise (only for a backend that
    declares ``BackendInfo.fp8``): then x is quantized per row to e4m3 as well and the product is
    ``tileinfer.backend.fp8``'s; or uint8 holding e4m3 bit patterns with weight_scale likewise
    (only for a backend that declares ``BackendInfo.fp8_weight_only``): x as it is, the
    weight-only product of ``tileinfer.backend.fp8``. out: (n, out_features), in x's dtype or
    float32 (e4m3 weights: x's dtype); accumulation in float32. The float32 sum (for an INT8 or
    e4m3 weight, scaled) is rounded once, to out's dtype: out in x's dtype is F.linear's output
    (transformers' rounding), a float32 out holds the unrounded float32 sum (the model's lm_head
    writes its float32 logits this way, on every backend, so that near ties between logits are
    not made exact ties by a bf16 rounding).

    batch_invariant (bool or ``Invariance``): True asks that, for steps of up to
    ``INVARIANT_MAX_ROWS`` rows, each row's result be the same bits as in a step of that row alone
    (a single sequence's steps: greedy speculative decoding compares a verify step's rows with
    1-token steps). False (the batched engine's steps, whose rows are separate sequences) lets the
    backend pick the fastest kernel for n rows, e.g. tensor-core tiles that read the weight once
    for all of them. ``Invariance.BATCH`` (only for a backend that declares
    ``BackendInfo.batch_invariant``): each row the same bits in a step of any number of rows.
    """


@hookspec
def linear_swiglu(out, x, weight, weight_scale, gate_up, batch_invariant):
    """SwiGLU MLP input: ``gate, up = split(x @ weight.T); out = silu(gate) * up``.

    weight: (2 * inter, in), gate rows stacked over up rows (int8, e4m3 or e4m3 bits with
    weight_scale as in linear); out: (n, inter). gate_up: (n, 2 * inter) scratch in x's dtype
    that a backend which does not fuse may use. Rounding as transformers: gate and up rounded to
    x's dtype, ``silu(gate)`` rounded, the product rounded. batch_invariant: as in ``linear``.
    """


@hookspec
def linear_xielu(out, x, weight, weight_scale, xielu, batch_invariant):
    """Ungated MLP input of Apertus: ``out = xielu(x @ weight.T)``.

    weight: (inter, in) (int8, e4m3 or e4m3 bits with weight_scale as in linear); out: (n, inter);
    xielu: the layer's ``XIELUScalars``. The product is rounded to x's dtype, then the activation
    is computed in float32 and rounded once to out's dtype. batch_invariant: as in ``linear``.
    """


@hookspec
def add_rmsnorm_e4m3(residual, out, out_q, out_scale, delta, weight, eps):
    """``add_rmsnorm``, and the e4m3 rows of its output for an FP8 product (optional, with
    ``linear_e4m3_input`` and ``linear_swiglu_e4m3_input``: a model with e4m3 weights then
    quantizes its norms' outputs here instead of in each linear op).

    Writes residual and out, the bits this backend's ``add_rmsnorm`` writes, then
    ``out_q, out_scale = tileinfer.backend.fp8.quantize_rows(out)``: out_q (n, hidden)
    float8_e4m3fn, out_scale (n,) float32. The quantization is exact arithmetic on out's values
    (IEEE divisions), so out_q and out_scale are ref's bits for this backend's out.
    """


@hookspec
def linear_e4m3_input(out, x_q, x_scale, weight, weight_scale, batch_invariant):
    """``linear`` with an e4m3 weight (``BackendInfo.fp8``) for an input given quantized
    (optional, with ``add_rmsnorm_e4m3``).

    x_q (n, in) float8_e4m3fn and x_scale (n,) float32 are ``quantize_rows(x)`` of a bf16 x;
    out (n, out_features) bf16 gets the bits ``linear(out, x, weight, weight_scale,
    batch_invariant)`` writes for that x, for every batch_invariant.
    """


@hookspec
def linear_swiglu_e4m3_input(out, x_q, x_scale, weight, weight_scale, gate_up, batch_invariant):
    """``linear_swiglu`` with an e4m3 weight for an input given quantized as in
    ``linear_e4m3_input`` (optional, with ``add_rmsnorm_e4m3``): the bits ``linear_swiglu(out,
    x, weight, weight_scale, gate_up, batch_invariant)`` writes.
    """


@hookspec
def attention_inputs(q_out, kv, qkv, qk, step):
    """Everything between the fused q/k/v projection and attention, as one op.

    qkv: (n, (heads + 2 * kv_heads) * head_dim), the q, k and v heads in that order; kv: the
    layer's ``LayerKV``; qk: a ``QKTransform``; step: an ``AttentionStep``. In float32: applies
    the per-head RMSNorm (if qk.q_norm / qk.k_norm are given, as ``rmsnorm`` with qk.norm_eps,
    rounded to qkv's dtype) and RoPE at step.positions to the queries and keys; writes the
    queries, rounded once, into q_out (n, heads, head_dim); stores the keys (rounded to qkv's
    dtype) and values at step.slots. Float cache: the vectors are copied. INT8 cache: each key is
    first divided by kv.k_smooth (if not None), then each vector gets ``scale = max|vec| / 127``
    (1.0 for an all-zero vector) in k_scale/v_scale and ``round(vec / scale)`` clamped to
    [-127, 127] in k_cache/v_cache.
    """


@hookspec
def attention_workspace(num_tokens, num_heads, head_dim, max_context_len, device):
    """Scratch memory that ``attention`` needs for steps of up to num_tokens query rows over up to
    max_context_len cached positions: a tensor (allocated here, once per buffer set) or None.
    The model allocates it with a step's buffers and passes it to every attention call."""


@hookspec
def attention(out, q, kv, step, scale, causal, workspace):
    """Paged grouped-query attention for a step of one or more sequences.

    q, out: (n, heads, head_dim); query head h reads kv head ``h // (heads // kv_heads)`` of the
    layer's pages kv (``LayerKV``); step: an ``AttentionStep``. Query row i of sequence b sits
    at position ``p = context_lens[b] - q_len_b + i``. causal: it sees cached positions
    ``0..p``; not causal: all ``context_lens[b]`` positions (a DFlash block).
    ``softmax(scale * q.k)`` in float32, the result rounded to out's dtype. workspace: from
    ``attention_workspace`` (or None).
    """


@hookspec
def attention_window(out, q, kv, step, scale, window, workspace):
    """Causal ``attention`` over a sliding window: the query row at position p sees the cached
    positions ``max(0, p - window + 1) .. p`` only (window >= 1; Gemma 3's local layers). The
    rest as ``attention``. A backend that leaves it out gets the ref backend's."""


@hookspec
def attention_with_inputs(out, q_out, kv, qkv, qk, step, scale, causal, workspace):
    """Optional: ``attention_inputs`` and then ``attention`` over the cache it wrote, as one op,
    so that a backend can run a decode step's two as one kernel.

    The model calls it instead of the two ops only when the backend implements it itself; a
    backend that does not fuse them leaves it out. The cache and out are as after the two ops;
    q_out is scratch (what it holds afterwards is unspecified).
    """


@hookspec
def reserve_scratch(device):
    """Allocate, once per device, any scratch memory the ops keep for themselves (split-K
    partials, sampling reductions), so that nothing is allocated while a CUDA graph is being
    captured. Called before a capture and when step buffers are made; a no-op when the backend
    keeps none."""


@hookspec
def sample_tokens(out, logits, temperature, top_k, top_p, seed, counter, probs_out):
    """Sample one token per logit row with a counter-based random stream.

    logits: (n, vocab) float32; out: (n,) int32; seed, counter: (1,) int64 device tensors; row j
    uses the stream ``(seed, counter + j)`` (the op does not advance counter). temperature,
    top_k, top_p: Python numbers. See ``tileinfer.backend.sampling`` for the exact definition, which
    ``sample_host`` implements: temperature 0 is argmax (lowest index on ties); otherwise the
    filtered distribution p (softmax of logits / temperature restricted to the top_k largest, then
    to the smallest top set whose mass reaches top_p) is sampled by the Gumbel-max trick with the
    noise ``tileinfer.backend.sampling.gumbel(seed, counter + j, token)``. probs_out: None, or (n, vocab)
    float32 receiving p (zeros outside the kept set) for speculative sampling.
    """


@hookspec
def sample_per_row(out, logits, inv_temperature, top_k, top_p, seed, counter):
    """Optional: sample one token per logit row, each row with its own parameters and stream (a
    batched step's rows are separate requests). Without it the batched engine groups its rows
    into ``sample_tokens`` calls, one per run of rows that share parameters and a seed.

    logits: (n, vocab) float32; out: (n,) int32; inv_temperature: (n,) float32, the row's
    ``SamplingParams.inv_temperature`` (float32(1 / temperature)), 0 for a greedy row; top_k: (n,)
    int32 (0: off); top_p: (n,) float32 (1: off); seed, counter: (n,) int64; all on the logits'
    device (a GPU backend reads them there, so that the op can be captured in a CUDA graph; ref
    reads them on the host). Row j is the token
    ``sample_tokens`` gives a one-row call with that row's parameters and the stream
    (seed[j], counter[j]): ``tileinfer.backend.sampling.sample_per_row`` defines it.
    """


@hookspec
def sample_tokens_with_sums(out, sums, logits, temperature, top_k, top_p, seed, counter):
    """Optional: ``sample_tokens`` (without probs_out) that also writes into sums (n,) float32
    the sum of each logit row, in any order of addition. The engine reads the sums only to see
    whether a row held NaN or infinity (``tileinfer.engine.runtime.finite``): a sampler that
    reads every logit anyway adds them for nearly nothing, where a separate reduction is one
    more kernel per step. Without it the engine calls ``sample_tokens`` and sums the rows with
    torch.
    """


@hookspec
def accept_tokens(out, logits, draft_ids, draft_probs, temperature, top_k, top_p, seed, counter):
    """The p/q rule of speculative sampling, one row per drafted position.

    logits: (n, vocab) float32 target logits; draft_ids: (n,) int32; draft_probs: (n, vocab)
    float32 draft distributions q, or None for deterministic drafts (q one-hot at the draft).
    With p the target's filtered distribution as in ``sample_tokens``: accept the draft d if
    ``u * q[d] < p[d]`` with u the uniform ``tileinfer.backend.sampling.uniform(seed, counter + j,
    ACCEPT_SALT)``, writing d to out[j]; otherwise write a token sampled from
    ``max(p - q, 0)`` (renormalized) with the Gumbel noise of ``(seed, counter + j)``.
    A rejected row's token therefore always differs from its draft.
    """
