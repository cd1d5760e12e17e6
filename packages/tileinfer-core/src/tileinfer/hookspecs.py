"""The op contract: one pluggy hookspec per op.

A backend is a plugin (a module or an object) registered under the entry-point group ``tileinfer``.
It implements ``tileinfer_backend_info`` and any subset of the ops below with ``@hookimpl``
functions of the same names and argument names. Ops it lacks fall back to the ``ref`` backend.

Conventions shared by every op (see DESIGN.md):

- Shapes are PyTorch's row-major shapes: hidden states ``(tokens, hidden)``, per-head tensors
  ``(tokens, heads, head_dim)``, linear weights ``(out_features, in_features)`` as in safetensors.
- Every op is *in place*: it writes its result into preallocated tensors (``out`` and the others
  named in its docstring), returns nothing, allocates no device memory and never synchronizes with
  the host, so that a whole step can be captured in a CUDA graph. ``tileinfer.ops`` has allocating
  wrappers for users and tests.
- Activations are ``bfloat16`` (or ``float16``/``float32``); arithmetic is done in float32 and
  rounded to the activation dtype where transformers rounds, so greedy tokens match it.
- Token ids, positions, context lengths and block tables are ``int32``; cache slots are ``int64``.
- A step holds one or more sequences flattened along the token axis: sequence ``b`` owns query rows
  ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``, which are the *last* ``q_len_b`` positions of its
  ``context_lens[b]`` cached positions (their keys and values are already in the cache).
- KV cache of one layer: ``k_cache`` and ``v_cache`` of shape ``(num_pages, page_size, kv_heads,
  head_dim)``. Cache slot ``s`` is offset ``s % page_size`` of page ``s // page_size``. A sequence's
  pages are listed in its row of ``block_table`` ``(batch, max_pages)``; entries past its pages are
  padding and must not be read. With an INT8 cache, ``k_cache``/``v_cache`` are ``int8`` and
  ``k_scale``/``v_scale`` ``(num_pages, page_size, kv_heads)`` float32 hold one scale per cached
  vector; keys may also be divided by per-channel smoothing factors ``k_smooth`` ``(kv_heads,
  head_dim)`` float32 before quantization: ``key ~= k_smooth * k_scale[..., None] * k_cache``.
  With a bf16 cache the three are ``None``.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("tileinfer")
hookimpl = pluggy.HookimplMarker("tileinfer")

# Sampling filters keep at most this many candidates when top_k > 0 is requested.
MAX_TOP_K = 1024


@hookspec
def tileinfer_backend_info():
    """Describe this backend: return a ``tileinfer.backends.BackendInfo``.

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
def linear(out, x, weight, weight_scale):
    """``out = x @ weight.T``.

    x: (n, in); weight: (out_features, in), same dtype as x, or int8 with weight_scale
    (out_features,) float32 meaning ``W[j, :] = weight_scale[j] * weight[j, :]`` (weight_scale is
    None for a float weight). out: (n, out_features), bf16 or float32; accumulation in float32.
    A float weight's product is rounded to x's dtype (F.linear's output) also when out is float32
    (the model writes its float32 logits this way); an INT8 weight's scaled sum is rounded once,
    to out's dtype.
    """


@hookspec
def linear_swiglu(out, x, weight, weight_scale, gate_up):
    """SwiGLU MLP input: ``gate, up = split(x @ weight.T); out = silu(gate) * up``.

    weight: (2 * inter, in), gate rows stacked over up rows (int8 with weight_scale as in linear);
    out: (n, inter). gate_up: (n, 2 * inter) scratch in x's dtype that a backend which does not
    fuse may use. Rounding as transformers: gate and up rounded to x's dtype, ``silu(gate)`` rounded,
    the product rounded.
    """


@hookspec
def linear_xielu(out, x, weight, weight_scale, alpha_p, alpha_n, beta, eps):
    """Ungated MLP input of Apertus: ``out = xielu(x @ weight.T)`` (see ``xielu``).

    weight: (inter, in) (int8 with weight_scale as in linear); out: (n, inter).
    """


@hookspec
def silu_mul(out, gate_up):
    """``out = silu(gate) * up`` for gate_up (n, 2 * inter) = [gate | up]; out: (n, inter).

    silu(gate) is rounded to the dtype before the product, as transformers computes it.
    """


@hookspec
def xielu(out, x, alpha_p, alpha_n, beta, eps):
    """The xIELU activation (arXiv:2411.13010) as transformers' XIELUActivation applies it.

    alpha_p, alpha_n, beta, eps: Python floats, already in their effective form (alpha_p =
    softplus(param), alpha_n = beta + softplus(param)) and rounded to x's dtype.
    ``out = x > 0 ? alpha_p * x * x + beta * x : (expm1(min(x, eps)) - x) * alpha_n + beta * x``,
    computed in float32 and rounded once to out's dtype.
    """


@hookspec
def rope(out, x, cos, sin, positions):
    """Rotary position embedding with the "rotate half" pairing of Llama/Qwen.

    x, out: (n, heads, head_dim); cos, sin: (max_len, head_dim // 2) float32 tables, row p for
    position p; positions: (n,) int32. With h = head_dim // 2, c = cos[positions[t], i],
    s = sin[positions[t], i], for i < h:
    ``out[t, :, i] = x[t, :, i] * c - x[t, :, i + h] * s`` and
    ``out[t, :, i + h] = x[t, :, i + h] * c + x[t, :, i] * s``, in float32, rounded once.
    """


@hookspec
def store_kv(k_cache, v_cache, k_scale, v_scale, k_smooth, k, v, slots):
    """Write the keys and values of n tokens into a layer's page pools.

    k, v: (n, kv_heads, head_dim); slots: (n,) int64 cache slots. bf16 cache: the vectors are
    copied. INT8 cache: each key vector is first divided by k_smooth (if not None), then each
    vector gets ``scale = max|vec| / 127`` (1.0 for an all-zero vector) written to
    k_scale/v_scale, and ``round(vec / scale)`` clamped to [-127, 127] into k_cache/v_cache.
    """


@hookspec
def attention_inputs(q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm, k_norm,
                     cos, sin, positions, slots, eps):
    """Everything between the fused q/k/v projection and attention, as one op.

    qkv: (n, (heads + 2 * kv_heads) * head_dim), the q, k and v heads in that order. q_norm,
    k_norm: (head_dim,) weights of the per-head RMSNorm of Qwen3/Apertus, or None. Applies
    ``rmsnorm`` (if given) and ``rope`` at positions to the queries and keys, writes the queries
    into q_out (n, heads, head_dim) and stores keys and values at slots as ``store_kv`` does.
    """


@hookspec
def attention_workspace(num_tokens, num_heads, head_dim, max_context_len, device):
    """Scratch memory that ``attention`` needs for steps of up to num_tokens query rows over up to
    max_context_len cached positions: a tensor (allocated here, once) or None."""


@hookspec
def attention(out, q, k_cache, v_cache, k_scale, v_scale, k_smooth, cu_seqlens_q, context_lens,
              block_table, max_query_len, max_context_len, scale, causal, workspace):
    """Paged grouped-query attention for a step of one or more sequences.

    q, out: (n, heads, head_dim); query head h reads kv head ``h // (heads // kv_heads)``.
    cu_seqlens_q: (batch + 1,) int32; context_lens: (batch,) int32; block_table: (batch, max_pages)
    int32. max_query_len and max_context_len are host-side upper bounds (Python ints) of the
    step's query lengths and context lengths, for choosing the launch grid; the true lengths are in
    the tensors. Query row i of sequence b sits at position ``p = context_lens[b] - q_len_b + i``.
    causal: it sees cached positions ``0..p``; not causal: all ``context_lens[b]`` positions
    (a DFlash block). ``softmax(scale * q.k)`` in float32, the result rounded to out's dtype.
    workspace: from ``attention_workspace`` (or None).
    """


@hookspec
def attention_with_inputs(out, q_out, k_cache, v_cache, k_scale, v_scale, k_smooth, qkv, q_norm,
                          k_norm, cos, sin, positions, slots, eps, cu_seqlens_q, context_lens,
                          block_table, max_query_len, max_context_len, scale, causal, workspace):
    """``attention_inputs`` and then ``attention`` over the cache it wrote, as one op (a backend
    can then run a decode step's two as one kernel).

    The arguments are those of the two ops: ``attention_inputs(q_out, k_cache, v_cache, k_scale,
    v_scale, k_smooth, qkv, q_norm, k_norm, cos, sin, positions, slots, eps)``, then
    ``attention(out, q_out, k_cache, ..., workspace)``. The cache and out are as after the two
    ops; q_out is scratch that a backend which does not fuse may use (what it holds afterwards is
    unspecified). The model calls it only where the backend implements it itself (ref's fallback
    would run the two ops of ref, not the backend's own).
    """


@hookspec
def sample_tokens(out, logits, temperature, top_k, top_p, seed, counter, probs_out):
    """Sample one token per logit row with a counter-based random stream.

    logits: (n, vocab) float32; out: (n,) int32; seed, counter: (1,) int64 device tensors; row j
    uses the stream ``(seed, counter + j)`` (the op does not advance counter). temperature,
    top_k, top_p: Python numbers. See ``tileinfer.sampling`` for the exact definition, which
    ``sample_host`` implements: temperature 0 is argmax (lowest index on ties); otherwise the
    filtered distribution p (softmax of logits / temperature restricted to the top_k largest, then
    to the smallest top set whose mass reaches top_p) is sampled by the Gumbel-max trick with the
    noise ``tileinfer.sampling.gumbel(seed, counter + j, token)``. probs_out: None, or (n, vocab)
    float32 receiving p (zeros outside the kept set) for speculative sampling.
    """


@hookspec
def accept_tokens(out, logits, draft_ids, draft_probs, temperature, top_k, top_p, seed, counter):
    """The p/q rule of speculative sampling, one row per drafted position.

    logits: (n, vocab) float32 target logits; draft_ids: (n,) int32; draft_probs: (n, vocab)
    float32 draft distributions q, or None for deterministic drafts (q one-hot at the draft).
    With p the target's filtered distribution as in ``sample_tokens``: accept the draft d if
    ``u * q[d] < p[d]`` with u the uniform ``tileinfer.sampling.uniform(seed, counter + j,
    ACCEPT_SALT)``, writing d to out[j]; otherwise write a token sampled from
    ``max(p - q, 0)`` (renormalized) with the Gumbel noise of ``(seed, counter + j)``.
    A rejected row's token therefore always differs from its draft.
    """
