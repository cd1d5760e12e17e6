"""TileInfer backend of CUDA C++ kernels compiled at run time with NVRTC.

The kernels are ``.cu`` files in ``kernels/`` (shipped in the wheel), compiled by
``compiler.py`` to cubins for the GPU's architecture with NVRTC through cuda-bindings, cached on
disk, and launched with the driver API on PyTorch's current stream, so a step of ops can be
captured in a CUDA graph. ``ops/`` holds the op wrappers, one module per kernel family; this
module registers them.

The backend needs a CUDA GPU of compute capability 8.0 or newer (bf16 tensor cores, cp.async),
``cuda-bindings`` and the NVRTC library (the ``nvidia-cuda-nvrtc`` wheel). No CUDA toolkit is
needed: the kernels include no toolkit header.
"""

from __future__ import annotations

from tileinfer.backend import BackendInfo, hookimpl

MIN_CAPABILITY = (8, 0)

NOTES = {
    "linear": "decode (<= 8 tokens): row-streaming GEMV (warps stream whole bf16/INT8 weight "
              "rows with 16-byte loads, split-K for narrow outputs), or for weights up to 4 MB, "
              "batched steps and INT8 weights with K % 16 != 0 the tensor-core GEMV fed by a "
              "cp.async ring (9..64 rows too, each weight read once); prefill: cuBLAS through "
              "torch.matmul for bf16 (float32 outputs too, where torch.mm has them); INT8 "
              "weights from 128 rows on cuBLAS with a bf16 copy (float32 sums, then the row "
              "scales), fewer rows on our own tiled mma GEMM; float32/float16 models: "
              "torch.matmul",
    "fp8": "e4m3 weights (compute capability 8.9+): inputs quantized per token by one kernel, "
           "then the tensor-core GEMV's FP8 build up to 16 rows (and at any count when "
           "batch-invariant), wgmma's FP8 products (Hopper, up to 64 rows, the MLP "
           "epilogues in the kernel), torch._scaled_mm (cuBLASLt FP8) above",
    "fp8_weight_only": "e4m3 weights as bits, activations as they are: INT8's kernels and "
                       "configurations, each byte decoded to bf16 exactly (integer ops and one "
                       "bf16 multiply: no FP8 hardware needed); cuBLAS on a bf16 copy for "
                       "prefill",
    "linear_swiglu": "decode: fused gate/up GEMV with the SwiGLU epilogue; prefill: linear + silu_mul",
    "linear_xielu": "decode: GEMV with the xIELU epilogue; prefill: linear + xielu",
    "attention": "paged FlashAttention-2 tiles on mma.sync, GQA rows packed per kv head, "
                 "flash-decoding split-KV with an in-kernel combine; bf16 queries with head_dim "
                 "a multiple of 64 (others: the ref implementation, not graph-safe)",
    "attention_with_inputs": "steps of one token per sequence: one kernel (the decode attention "
                             "computes the queries and stores the new key and value itself); "
                             "other steps: attention_inputs + attention",
    "sample_tokens": "one block per row; top-k by radix select, top-p by bisection over "
                     "fixed-point masses; float32 logits",
    "accept_tokens": "one block per row, the p/q rule with the host's hash",
    "sample_per_row": "one block per row, each with its own parameters and stream",
    "sample_tokens_with_sums": "greedy: the split argmax adds up each row as it reads it",
    "batch_invariant": "linear: the tensor-core GEMV at every row count (launches of up to 64 "
                       "rows, the warps that split K fixed per weight); attention: every row "
                       "on the decode kernel, 256-key splits",
}


def _availability() -> tuple[bool, str]:
    try:
        import torch
    except Exception as exc:  # pragma: no cover - torch is a dependency
        return False, f"torch is not importable: {exc!r}"
    try:
        from cuda.bindings import driver, nvrtc  # noqa: F401
    except Exception as exc:
        return False, f"cuda-bindings is not importable: {exc!r}"
    try:
        from . import compiler

        compiler.nvrtc_version()  # loads the NVRTC library
    except Exception as exc:
        return False, f"NVRTC is not loadable (install nvidia-cuda-nvrtc): {exc!r}"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    capability = torch.cuda.get_device_capability()
    if capability < MIN_CAPABILITY:
        return False, (f"the GPU has compute capability {capability[0]}.{capability[1]}; the "
                       f"kernels need {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or newer")
    return True, ""


def _fp8() -> bool:
    """Whether the GPU has e4m3 conversions and FP8 tensor cores (ops/linear_fp8.py)."""
    import torch

    from .ops.common import FP8_CAPABILITY

    return torch.cuda.get_device_capability() >= FP8_CAPABILITY


_AVAILABLE, _REASON = _availability()
_FP8 = _AVAILABLE and _fp8()


@hookimpl
def tileinfer_backend_info():
    return BackendInfo(name="cuda", available=_AVAILABLE, reason=_REASON, devices=("cuda",),
                       graph_safe=True, notes=NOTES, batch_invariant=True, fp8=_FP8,
                       fp8_weight_only=True)


# The op implementations live in ops/ (ops.OPS); each is registered here under its hookspec's
# name (pluggy checks the argument names). Without a usable GPU nothing is registered and every
# op would fall back to ref, but get_backend("cuda") refuses first with the reason above.
if _AVAILABLE:
    from . import ops as _ops

    for _name, _fn in _ops.OPS.items():
        globals()[_name] = hookimpl(_fn)
    del _name, _fn
