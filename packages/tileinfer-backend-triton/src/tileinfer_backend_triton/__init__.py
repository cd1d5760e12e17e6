"""TileInfer backend of Triton kernels.

Every op of ``tileinfer.backend.hookspecs`` except the optional ``attention_with_inputs`` is a
thin wrapper here around a launcher in ``kernels/`` (one op family per module, the kernel beside
its launcher; the launchers take plain tensors, the wrappers unpack the grouped arguments). All
ops write into the given outputs, allocate nothing on the hot path and never synchronize with the
host, so a step can be captured in a CUDA graph. The device memory the backend owns: the split-K
scratch of the linear kernels, the quantized input of the FP8 products and the split argmax's
scratch of the sampler (each allocated once per device, by ``reserve_scratch`` or on first use)
and the attention workspace that
``attention_workspace`` returns. On Hopper the decode-path kernels use programmatic dependent
launch (kernels/common.py; ``TILEINFER_TRITON_PDL=0`` turns it off). docs/triton-kernels.md
describes the kernels' design.

On a machine without a CUDA GPU it is available only under Triton's interpreter
(``TRITON_INTERPRET=1``, which CI uses to check the kernels on the CPU).
"""

from __future__ import annotations

import os

from tileinfer.backend import BackendInfo, hookimpl


def _availability():
    try:
        import torch
        import triton  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the machine
        return False, f"triton is not importable: {exc!r}", ("cuda",)
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True, "", ("cpu",)
    if not torch.cuda.is_available():
        return False, "no CUDA GPU (set TRITON_INTERPRET=1 to run the kernels on the CPU)", ("cuda",)
    return True, "", ("cuda",)


_AVAILABLE, _REASON, _DEVICES = _availability()


_KEY_THREAD = None  # the thread that makes Triton's cache key, while it may still run


def _hash_triton_in_background():
    """Triton keys its on-disk kernel cache with a hash of its own installation, made once per
    process at the first kernel launch, where a new process's first answer would wait for it.
    A thread started when the backend loads takes the key remembered from an earlier process
    (``triton_key.py``), or makes it (hashlib lets go of the interpreter's lock while it hashes)
    while the model's weights load, then preloads the kernels earlier processes launched
    (``warm_start.py``). ``_await_triton_key`` stops the preloading and waits for that thread
    before the first launch (a model's ``reserve_scratch``, or any launch that has to find its
    kernel: Triton's jit_cache_hook): a launch before then would hash the installation again,
    or make kernels beside the thread."""
    global _KEY_THREAD
    import threading

    try:
        from triton.runtime import cache  # noqa: F401
    except ImportError:  # another Triton layout: the first launch makes it, as before
        return
    from . import warm_start

    if warm_start.enabled():
        warm_start.install_hook(before_launch_compile=_await_triton_key)
    _KEY_THREAD = threading.Thread(target=_prepare_triton, name="tileinfer-triton-key",
                                   daemon=True)
    _KEY_THREAD.start()


def _prepare_triton():
    from . import warm_start
    from .triton_key import install_remembered_key

    fingerprint = install_remembered_key()
    if fingerprint is not None and warm_start.enabled():
        try:
            warm_start.start(fingerprint)
        except Exception:  # noqa: BLE001 - no preloading: each kernel loads at its first launch
            pass


def _await_triton_key():
    global _KEY_THREAD
    import threading

    if _KEY_THREAD is not None and _KEY_THREAD is not threading.current_thread():
        from . import warm_start

        warm_start.stop()
        _KEY_THREAD.join()
        _KEY_THREAD = None


if _AVAILABLE and "cuda" in _DEVICES:
    _hash_triton_in_background()

if _AVAILABLE:
    import torch

    from .kernels import accept as _accept
    from .kernels import attention as _attention
    from .kernels import embed as _embed
    from .kernels import linear as _linear
    from .kernels import linear_fp8 as _linear_fp8
    from .kernels import norms as _norms
    from .kernels import rope_kv as _rope_kv
    from .kernels import sampling as _sampling

# FP8 linear ops on a GPU with e4m3 conversions and FP8 tensor cores, or under the interpreter.
_FP8 = _AVAILABLE and _linear_fp8.fp8_supported(torch.device(_DEVICES[0]))

NOTES = {
    "linear": "decode (<= 16 tokens): weight-streaming GEMV with split-K; prefill: tiled tl.dot GEMM",
    "attention": "paged FlashAttention-2 kernel, GQA heads packed per KV head, split-KV "
                 "(flash-decoding) for decode steps",
    "attention_inputs": "one kernel: q/k RMSNorm, RoPE and the k/v store (bf16 or INT8) per token",
    "sample_tokens": "greedy / temperature: argmax split over the vocabulary; top-k/top-p: one "
                     "program per row, thresholds by 32-step bisection",
    "sample_tokens_with_sums": "greedy: the split argmax adds up each row as it reads it",
    "sample_per_row": "one program per row, each with its own parameters and stream",
    "gemma_rmsnorm": "the rmsnorm kernel with Gemma's float32 weight and one rounding (the "
                     "residual add fused in add_gemma_rmsnorm)",
    "batch_invariant": "linear: tensor-core tiles over K segments fixed by the weight; "
                       "attention: one row per program, 256-position splits",
    "fp8": "e4m3 weights (compute capability 8.9+): inputs quantized per token by one kernel, "
           "then tl.dot on FP8 tensor cores in 16-token tiles (64 for batched steps past 16)",
    "fp8_weight_only": "e4m3 weights as bits, activations as they are: INT8's kernels with the "
                       "e4m3 values decoded exactly in place of the int8 ones",
}


@hookimpl
def tileinfer_backend_info():
    return BackendInfo(name="triton", available=_AVAILABLE, reason=_REASON, devices=_DEVICES,
                       graph_safe=True, notes=NOTES, batch_invariant=True, fp8=_FP8,
                       fp8_weight_only=True)


if _AVAILABLE:

    @hookimpl
    def embed(out, table, ids):
        _embed.launch_embed(out, table, ids)

    @hookimpl
    def rmsnorm(out, x, weight, eps):
        _norms.launch_rmsnorm(out, x, weight, eps)

    @hookimpl
    def add_rmsnorm(residual, out, delta, weight, eps):
        _norms.launch_rmsnorm(out, residual, weight, eps, residual_delta=delta)

    @hookimpl
    def gemma_rmsnorm(out, x, weight, eps):
        _norms.launch_rmsnorm(out, x, weight, eps, gemma=True)

    @hookimpl
    def add_gemma_rmsnorm(residual, out, delta, weight, eps):
        _norms.launch_rmsnorm(out, residual, weight, eps, residual_delta=delta, gemma=True)

    @hookimpl
    def add_rmsnorm_e4m3(residual, out, out_q, out_scale, delta, weight, eps):
        if residual.dim() == 2 and out_q.is_contiguous() and out_scale.is_contiguous():
            return _norms.launch_rmsnorm(out, residual, weight, eps, residual_delta=delta,
                                         e4m3=(out_q, out_scale))
        _norms.launch_rmsnorm(out, residual, weight, eps, residual_delta=delta)
        _linear_fp8.quantize_rows(out, out_q, out_scale)

    @hookimpl
    def linear_e4m3_input(out, x_q, x_scale, weight, weight_scale, batch_invariant=True):
        _linear_fp8.launch_fp8(out, out, weight, weight_scale, invariant=batch_invariant,
                               quantized=(x_q, x_scale))

    @hookimpl
    def linear_swiglu_e4m3_input(out, x_q, x_scale, weight, weight_scale, gate_up,
                                 batch_invariant=True):
        _linear_fp8.launch_fp8(out, out, weight, weight_scale, act=_linear.ACT_SWIGLU,
                               invariant=batch_invariant, quantized=(x_q, x_scale))

    def _launcher(weight):
        """The linear ops' launcher for weight: the FP8 product for e4m3, else linear.py's."""
        return _linear_fp8.launch_fp8 if weight.dtype == _linear_fp8.E4M3 else \
            _linear.launch_linear

    @hookimpl
    def linear(out, x, weight, weight_scale, batch_invariant=True):
        _launcher(weight)(out, x, weight, weight_scale, invariant=batch_invariant)

    @hookimpl
    def linear_swiglu(out, x, weight, weight_scale, gate_up, batch_invariant=True):
        # Fused: gate and up rows in the same program, the activation in the epilogue; the
        # gate_up scratch is not needed.
        _launcher(weight)(out, x, weight, weight_scale, act=_linear.ACT_SWIGLU,
                          invariant=batch_invariant)

    @hookimpl
    def linear_xielu(out, x, weight, weight_scale, xielu, batch_invariant=True):
        _launcher(weight)(out, x, weight, weight_scale, act=_linear.ACT_XIELU,
                          act_args=(xielu.alpha_p, xielu.alpha_n, xielu.beta, xielu.eps),
                          invariant=batch_invariant)

    @hookimpl
    def attention_inputs(q_out, kv, qkv, qk, step):
        _rope_kv.launch_attention_inputs(q_out, kv.k_cache, kv.v_cache, kv.k_scale, kv.v_scale,
                                         kv.k_smooth, qkv, qk.q_norm, qk.k_norm, qk.cos, qk.sin,
                                         step.positions, step.slots, qk.norm_eps)

    @hookimpl
    def attention_workspace(num_tokens, num_heads, head_dim, max_context_len, device):
        return _attention.workspace(num_tokens, num_heads, head_dim, max_context_len, device)

    @hookimpl
    def attention(out, q, kv, step, scale, causal, workspace):
        _attention.launch_attention(out, q, kv.k_cache, kv.v_cache, kv.k_scale, kv.v_scale,
                                    kv.k_smooth, step.cu_seqlens_q, step.context_lens,
                                    step.block_table, step.max_query_len, step.max_context_len,
                                    scale, causal, workspace,
                                    batch_invariant=step.batch_invariant)

    @hookimpl
    def attention_window(out, q, kv, step, scale, window, workspace):
        _attention.launch_attention(out, q, kv.k_cache, kv.v_cache, kv.k_scale, kv.v_scale,
                                    kv.k_smooth, step.cu_seqlens_q, step.context_lens,
                                    step.block_table, step.max_query_len, step.max_context_len,
                                    scale, True, workspace, batch_invariant=step.batch_invariant,
                                    window=window)

    @hookimpl
    def reserve_scratch(device):
        _await_triton_key()  # called before a model's first step, so before its first launch
        # Once per device (later calls find it): the linear kernels' split-K partials and
        # counters, and the split argmax's partials and counters of the sampler. The scratch is
        # keyed by the device of the launches' tensors, which always has an index ("cuda:0").
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        _linear.reserve_scratch(device)
        _linear_fp8.reserve_scratch(device)
        _sampling.reserve_scratch(device)

    @hookimpl
    def sample_tokens(out, logits, temperature, top_k, top_p, seed, counter, probs_out):
        _sampling.launch_sample(out, logits, temperature, top_k, top_p, seed, counter, probs_out)

    @hookimpl
    def sample_tokens_with_sums(out, sums, logits, temperature, top_k, top_p, seed, counter):
        if not _sampling.launch_sample(out, logits, temperature, top_k, top_p, seed, counter,
                                       None, sums):
            torch.sum(logits, dim=1, out=sums)

    @hookimpl
    def sample_per_row(out, logits, inv_temperature, top_k, top_p, seed, counter):
        _sampling.launch_sample_per_row(out, logits, inv_temperature, top_k, top_p, seed, counter)

    @hookimpl
    def accept_tokens(out, logits, draft_ids, draft_probs, temperature, top_k, top_p, seed,
                      counter):
        _accept.launch_accept(out, logits, draft_ids, draft_probs, temperature, top_k, top_p,
                              seed, counter)
