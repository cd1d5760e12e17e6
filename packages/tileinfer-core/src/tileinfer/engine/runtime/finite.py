"""Catching a model that computes NaN or infinity (activations that overflow, a plugin op that
writes NaN or nothing), so that it ends a request with a clear error instead of printing
garbage tokens.

Each step also sums the logits of its sampled rows on the device, inside its CUDA graph: in the
sampling kernel itself where the backend has the optional ``sample_tokens_with_sums`` op (the
sampler reads every logit anyway), else one small reduction beside the step's kernels. NaN or
infinity in any logit makes the sum non-finite (the logits of a sane model are a few tens in
size, far from float32's range, so the sum of a vocabulary of them never overflows). The sum
travels to the host with the sampled token, in the same asynchronous copy, so checking it costs
no extra synchronization; the host raises (or fails the request) when it reads a token whose sum
is not finite.
"""

from __future__ import annotations

import math

import torch


class NonFiniteLogitsError(RuntimeError):
    """The model's logits were NaN or infinite at a step: its output would be garbage."""


def non_finite(total: float, token_index: int, backend: str) -> str | None:
    """What is wrong when ``total`` (the sum of the logits that gave new token ``token_index``,
    0-based) is not finite, else None."""
    if math.isfinite(total):
        return None
    return (f"the model computed non-finite logits (NaN or infinity) for generated token "
            f"{token_index} on backend {backend!r}; its output would be garbage (a backend op or "
            "the weights are broken: try the ref backend, or check the model's weights)")


def check_finite(total: float, token_index: int, backend: str):
    """NonFiniteLogitsError unless ``total`` is finite (see ``non_finite``)."""
    problem = non_finite(total, token_index, backend)
    if problem is not None:
        raise NonFiniteLogitsError(problem)


def sample_with_sums(ops, out, sums, logits, temperature, top_k, top_p, seed, counter):
    """``ops.sample_tokens(out, logits, ...)`` (no probs_out), and the sum of each row of logits
    into sums: in one call where the backend has ``sample_tokens_with_sums``."""
    if ops.sample_tokens_with_sums is not None:
        ops.sample_tokens_with_sums(out, sums, logits, temperature, top_k, top_p, seed, counter)
    else:
        ops.sample_tokens(out, logits, temperature, top_k, top_p, seed, counter, None)
        torch.sum(logits, dim=1, out=sums)
