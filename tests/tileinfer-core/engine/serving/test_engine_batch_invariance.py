"""A model loaded with ``batch_invariant=True``: a request's tokens and logprobs are the same bits
alone and among others (mixed lengths, chunked prefill, a prefix-cache hit, preemption), greedy
and seeded, on every backend that declares the mode. On the CPU, ref and the Triton kernels
under the interpreter (float32); on a GPU ref, triton and cuda in bfloat16 with CUDA graphs and
pipelining, where without the mode the rows differ."""

from __future__ import annotations

import os

import pytest
import torch

from tileinfer import LLMEngine, SamplingParams, load_model
from tileinfer.backend import BackendError, BackendInfo, hookimpl
from tileinfer.backend.registry import get_backend, registry
from tileinfer.model.quant import backend_takes
from tiny_models import prompt_ids, single_torch_thread, tiny  # noqa: F401

MAX_LEN = 96
ON_GPU = torch.cuda.is_available()
DTYPE = torch.bfloat16 if ON_GPU else torch.float32


BACKENDS = ["ref", "triton", "cuda"]


def invariant_model(tiny, backend, quantize=None, arch="llama"):
    try:
        ops = get_backend(backend)
    except BackendError as exc:
        pytest.skip(str(exc))
    if not backend_takes(ops.backend.info, quantize):
        pytest.skip(f"backend {backend!r} does not declare {quantize} linear ops")
    return load_model(tiny.directory(arch, dtype=DTYPE), dtype=DTYPE, backend=backend,
                      max_len=MAX_LEN, batch_invariant=True, quantize=quantize)


def outputs(engine, requests):
    """Each request's (tokens, logprobs) after stepping the engine to the end."""
    ids = [engine.add_request(**r) for r in requests]
    got = {rid: ([], []) for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id][0].extend(out.new_tokens)
            got[out.request_id][1].extend(out.logprobs or [])
    return [got[rid] for rid in ids]


# Fewer and shorter requests on the CPU, where Triton's interpreter runs each program in Python.
NEW_TOKENS = 12 if ON_GPU or os.environ.get("FULL") else 5
OTHERS = 9 if ON_GPU or os.environ.get("FULL") else 4


def probe(sampling, seed=7, prompt=None):
    return dict(prompt_ids=prompt or prompt_ids(37, seed=3), max_new_tokens=NEW_TOKENS,
                stop_ids=[], sampling=sampling, seed=seed, logprobs=2)


def others(n=OTHERS):
    lengths = [1, 33, 16, 47, 5, 20, 64, 70, 3][:n]
    return [dict(prompt_ids=prompt_ids(m, seed=20 + i), max_new_tokens=2 + i, stop_ids=[],
                 sampling=SamplingParams(0.9 if i % 2 else 0.0), seed=i, logprobs=2)
            for i, m in enumerate(lengths)]


def alone_and_among_others(model, sampling=SamplingParams()):
    """The probe's (tokens, logprobs) alone (prefill in one step) and as the third of a mix
    (prefill in chunks of 24 tokens)."""
    alone = outputs(LLMEngine(model, num_pages=60, max_step_tokens=64), [probe(sampling)])[0]
    mix = others()
    mix.insert(2, probe(sampling))
    return alone, outputs(LLMEngine(model, num_pages=60, max_step_tokens=24), mix)[2]


def covered_on_the_cpu(backend):
    """Triton under the interpreter runs the greedy mix and the prefix / preemption case here;
    its seeded and FP8 mixes (each over a minute there) run on the GPU, while the CPU keeps
    ref's engine runs of them and the conformance suite's per-op rows for Triton's sampler and
    FP8 linears."""
    if backend == "triton" and not ON_GPU:
        pytest.skip("on the CPU: Triton's greedy engine run, ref's and the per-op cases cover it")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(0.8, top_p=0.95)],
                         ids=["greedy", "seeded"])
def test_a_request_is_the_same_alone_and_among_others(tiny, sampling, backend):
    if sampling.temperature > 0:
        covered_on_the_cpu(backend)
    alone, among = alone_and_among_others(invariant_model(tiny, backend), sampling)
    assert among == alone  # tokens, and each logprob and its top-2, to the bit


@pytest.mark.parametrize("backend", [pytest.param("ref"), pytest.param("triton", marks=(
    () if ON_GPU else pytest.mark.skip(reason="the interpreter's run is covered by ref's"))),
    "cuda"])
def test_gemma3_is_the_same_alone_and_among_others(tiny, backend):
    """Gemma 3's norms (the backend's gemma_rmsnorm ops, else the model's in blocks of rows) and
    its windowed local layer."""
    alone, among = alone_and_among_others(invariant_model(tiny, backend, arch="gemma3"))
    assert among == alone


@pytest.mark.parametrize("quantize", ["fp8", "fp8-weight-only", "int8"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_quantized_weights_keep_a_request_the_same_alone_and_among_others(tiny, backend,
                                                                          quantize):
    """FP8 weights (each row's activations quantized on their own), FP8 weight-only and INT8
    weights: the same bits in any step."""
    covered_on_the_cpu(backend)
    alone, among = alone_and_among_others(invariant_model(tiny, backend, quantize=quantize))
    assert among == alone


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_prefix_cache_hit_and_preemption_change_nothing(tiny, backend):
    model = invariant_model(tiny, backend)
    shared = prompt_ids(40, seed=5)
    request = probe(SamplingParams(), prompt=shared + prompt_ids(9, seed=6))
    cold = outputs(LLMEngine(model, num_pages=60), [request])[0]
    engine = LLMEngine(model, num_pages=60, max_step_tokens=32)
    outputs(engine, [dict(probe(SamplingParams(), prompt=shared + [1, 2, 3]), max_new_tokens=2)])
    assert outputs(engine, [request])[0] == cold  # its first 40 tokens' pages from the cache
    assert engine.stats()["prefix_hit_tokens"] > 0
    # A pool so small that requests are preempted and recomputed.
    tight = LLMEngine(model, num_pages=8, max_step_tokens=32)
    mix = others()
    mix.insert(2, request)
    assert outputs(tight, mix)[2] == cold
    assert tight.stats()["preemptions"] > 0


class _Undeclared:
    """A backend plugin that declares nothing beyond its name (every op falls back to ref)."""

    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="undeclared-toy", available=True, devices=("cpu", "cuda"))


@pytest.fixture
def undeclared():
    registry().register(_Undeclared())
    yield "undeclared-toy"
    registry().unregister("undeclared-toy")


def test_a_backend_that_does_not_declare_it_is_refused(tiny, undeclared):
    with pytest.raises(ValueError, match="does not declare batch-invariant ops"):
        load_model(tiny.directory("llama"), backend=undeclared, max_len=MAX_LEN,
                   batch_invariant=True)
