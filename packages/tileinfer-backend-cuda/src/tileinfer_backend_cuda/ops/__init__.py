"""The CUDA backend's ops, one module per kernel family of ``kernels/``: thin wrappers that check
layouts, pick a build and a grid, and launch on PyTorch's current stream (``compiler.py``).

common.py: dtypes, layout checks, device properties, per-device scratch, the fallback to ref;
tuning.py: launch configurations and the benchmark-only switch (TILEINFER_CUDA_EXPERIMENTS);
elementwise.py, norm.py, linear.py (cublas.py for bf16 products past the GEMVs, linear_fp8.py for
e4m3 weights; linear_ops.py picks), kv.py, attention.py, sampling.py: the ops.
"""

from . import (attention, common, cublas, elementwise, kv, linear, linear_fp8,  # noqa: F401
               linear_ops, norm, sampling, tuning)


def reserve_scratch(device):
    """Every scratch the ops keep (``common.reserve_scratch``), and cuBLAS's handles
    (``cublas.make_handles``): before a model's first step and any capture."""
    common.reserve_scratch(device)
    cublas.make_handles(device)


# The ops of the contract (tileinfer.backend.hookspecs) that this backend implements.
OPS = {
    "embed": elementwise.embed,
    "rmsnorm": norm.rmsnorm,
    "add_rmsnorm": norm.add_rmsnorm,
    "gemma_rmsnorm": norm.gemma_rmsnorm,
    "add_gemma_rmsnorm": norm.add_gemma_rmsnorm,
    "linear": linear_ops.linear,
    "linear_swiglu": linear_ops.linear_swiglu,
    "linear_xielu": linear_ops.linear_xielu,
    "add_rmsnorm_e4m3": norm.add_rmsnorm_e4m3,
    "linear_e4m3_input": linear_fp8.linear_e4m3_input,
    "linear_swiglu_e4m3_input": linear_fp8.linear_swiglu_e4m3_input,
    "attention_inputs": kv.attention_inputs,
    "attention_workspace": attention.attention_workspace,
    "attention": attention.attention,
    "attention_window": attention.attention_window,
    "attention_with_inputs": attention.attention_with_inputs,
    "reserve_scratch": reserve_scratch,
    "sample_tokens": sampling.sample_tokens,
    "sample_per_row": sampling.sample_per_row,
    "sample_tokens_with_sums": sampling.sample_tokens_with_sums,
    "accept_tokens": sampling.accept_tokens,
}

# Calls that went to the ref backend (or a slower path), by op and reason.
fallback_counts = common.fallback_counts
