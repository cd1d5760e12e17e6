"""An FP8 model quantizes its projections' inputs in the norms before them (the optional
add_rmsnorm_e4m3, linear_e4m3_input and linear_swiglu_e4m3_input ops) where the backend has
those ops, and the logits are the same bits as with each linear op quantizing its own input.

The ref backend implements the three ops; the same backend with them hidden (the model then
calls add_rmsnorm and the linear ops) is the reference, at decode steps, a prompt step and a
batch of several sequences, in the default and the batch-invariant mode."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tileinfer.engine.generation.forward import forward, forward_batch
from tileinfer.engine.kv.cache import new_cache
from tileinfer.model import load_model
from tiny_models import prompt_ids, tiny  # noqa: F401

E4M3_OPS = ("add_rmsnorm_e4m3", "linear_e4m3_input", "linear_swiglu_e4m3_input")


class _Ops:
    """A backend's op table that counts the calls of each op, or hides the e4m3-input ops."""

    def __init__(self, ops, hide_e4m3: bool):
        self._ops, self.calls = ops, Counter()
        for name in E4M3_OPS if hide_e4m3 else ():
            setattr(self, name, None)

    def __getattr__(self, name):
        op = getattr(self._ops, name)
        if not callable(op):
            return op

        def counted(*args):
            self.calls[name] += 1
            return op(*args)
        return counted


def _run(model, prompt, tokens):
    """Logits of a prompt step, decode steps along tokens, and one step of three sequences."""
    cache = new_cache(model, max_tokens=256)
    seq = cache.new_sequence()
    rows = [forward(model, cache, seq, prompt)[-1]]
    for token in tokens:
        rows.append(forward(model, cache, seq, [token])[-1])
    others = [cache.new_sequence() for _ in range(3)]
    batch = forward_batch(model, cache, others, [prompt[:5], prompt[5:12], tokens[:3]])
    return torch.cat([torch.stack(rows), batch]).cpu()


@pytest.mark.parametrize("batch_invariant", [False, True], ids=["default", "invariant"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_norms_quantizing_give_the_same_logits(tiny, arch, batch_invariant):
    directory = tiny.directory(arch, False, torch.bfloat16)
    model = load_model(directory, max_len=64, quantize="fp8", batch_invariant=batch_invariant)
    backend_ops = model.ops
    assert model.e4m3_norms
    prompt, tokens = prompt_ids(12), prompt_ids(6, seed=5)

    model.ops = _Ops(backend_ops, hide_e4m3=False)
    fused, calls = _run(model, prompt, tokens), model.ops.calls
    model.ops = _Ops(backend_ops, hide_e4m3=True)
    assert not model.e4m3_norms
    plain, plain_calls = _run(model, prompt, tokens), model.ops.calls

    assert torch.equal(fused, plain)
    assert fused.isfinite().all()
    layers, steps = model.config.num_layers, 1 + len(tokens) + 1
    # every norm but layer 0's first and the final norm quantizes; its projections take it
    assert calls["add_rmsnorm_e4m3"] == steps * (2 * layers - 1)
    assert calls["add_rmsnorm"] == steps and calls["rmsnorm"] >= steps
    assert calls["linear_e4m3_input"] == steps * (layers - 1)
    assert calls["linear_swiglu_e4m3_input"] == steps * layers
    assert "linear_swiglu" not in calls
    assert plain_calls["linear_swiglu"] == steps * layers
    assert not any(plain_calls[name] for name in E4M3_OPS)


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "apertus", "smollm3", "granite", "phi3"])
def test_other_architectures_give_the_same_logits(tiny, arch):
    """Qwen2's biased qkv and Apertus' ungated MLP take the plain ops after a quantizing norm
    (which writes h as well); Granite scales, SmolLM3 skips RoPE in some layers."""
    model = load_model(tiny.directory(arch, False, torch.bfloat16), max_len=64, quantize="fp8")
    backend_ops = model.ops
    prompt, tokens = prompt_ids(9), prompt_ids(3, seed=7)
    model.ops = _Ops(backend_ops, hide_e4m3=False)
    fused, calls = _run(model, prompt, tokens), model.ops.calls
    model.ops = _Ops(backend_ops, hide_e4m3=True)
    assert torch.equal(fused, _run(model, prompt, tokens))
    assert calls["add_rmsnorm_e4m3"] == 5 * (2 * model.config.num_layers - 1)


@pytest.mark.parametrize("quantize", [None, "int8", "fp8-weight-only"])
def test_only_fp8_models_quantize_in_their_norms(tiny, quantize):
    model = load_model(tiny.directory("llama", False, torch.bfloat16), max_len=32,
                       quantize=quantize)
    assert not model.e4m3_norms
    buffers = model.new_buffers(2, 1)
    assert buffers.normed_q is None and buffers.normed_scale is None
