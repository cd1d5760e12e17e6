"""Helpers shared by the speculative decoding tests."""

from __future__ import annotations

import pytest
import torch
from gpu_params import gpu_backends  # noqa: F401  (the tests import it from here)

from tileinfer.engine.kv.cache import new_cache


@pytest.fixture(autouse=True, scope="module")
def one_cpu_thread():
    """One CPU thread for tiny steps: on a shared machine a thread pool's hand-offs cost far more
    than the work (measured: 2 ms per tiny step instead of 300 ms)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def divergence(model, prompt, plain, out) -> str:
    """Where speculative output ``out`` first differs from plain greedy ``plain``, and how close
    plain decoding's two best logits were there (in ulps of the model dtype): a gap of about one
    ulp is a near tie that a step of another row count, summing in another order, can flip."""
    from tileinfer import forward

    i = next((i for i, (a, b) in enumerate(zip(out, plain)) if a != b), min(len(out), len(plain)))
    if i >= len(plain):
        return f"outputs differ in length ({len(out)} vs {len(plain)})"
    cache = new_cache(model, len(prompt) + i + 1)
    logits = forward(model, cache, cache.new_sequence(), prompt + plain[:i])[0].float()
    top = torch.topk(logits, 2)
    bits = torch.finfo(model.dtype).nmant + 1
    ulp = 2.0 ** (torch.floor(torch.log2(top.values[0].abs())) - (bits - 1))
    gap = float((top.values[0] - top.values[1]) / ulp)
    return (f"first different token at {i}: plain {plain[i]}, speculative {out[i]}; plain's top "
            f"two logits there are {gap:.2f} ulps apart (tokens {top.indices.tolist()})")
