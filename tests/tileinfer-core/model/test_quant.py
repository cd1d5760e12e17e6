"""INT8 weights and INT8 KV pages against the bf16 model.

Bounds measured on the tiny models (bf16 model, 20-token prompt, 40 greedy steps teacher-forced
along the bf16 model's own trajectory), logit scale s = max |bf16 logit| ~ 3-4:

                      max |logit diff|      mean |diff|     argmax agreement
  INT8 weights        <= 0.032 s (0.119)    <= 0.006 s      >= 95%
  INT8 KV             <= 0.023 s (0.086)    <= 0.0031 s     >= 92.5%
  INT8 KV, smoothed   <= 0.018 s (0.068)    <= 0.0031 s     >= 95%

The tests assert about twice the measured error and 85% agreement.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.engine.kv.cache import new_cache
from tileinfer.engine.generation.calibration import calibrate_key_smoothing
from tileinfer.engine.generation.forward import forward
from tileinfer.model import load_model
from tileinfer.model.quant import Int8Weight, quantize_int8
from tileinfer.model.weights import weight_bytes
from tiny_models import ARCHS, prompt_ids, single_torch_thread, tiny  # noqa: F401

STEPS = 40


def test_quantize_int8_is_symmetric_per_output_channel():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 96, generator=gen) * torch.logspace(-3, 1, 64)[:, None]
    w[5] = 0.0
    q = quantize_int8(w.to(torch.bfloat16))
    assert q.q.dtype == torch.int8 and q.q.shape == w.shape
    assert q.scale.dtype == torch.float32 and q.scale.shape == (64,)
    wb = w.to(torch.bfloat16).float()
    amax = wb.abs().amax(1)
    nonzero = amax > 0
    torch.testing.assert_close(q.scale[nonzero], amax[nonzero] / 127)
    assert q.scale[5] == 1.0 and bool((q.q[5] == 0).all())
    # Each row's largest magnitude maps to +-127; every element is within half a step.
    assert torch.equal(q.q.abs().amax(1)[nonzero], torch.full((63,), 127, dtype=torch.int8))
    err = (q.dequantize() - wb).abs()
    assert bool((err <= q.scale[:, None] / 2 * (1 + 1e-5)).all())  # float32 rounding slack


def test_int8_model_quantizes_every_linear_and_keeps_the_embedding(tiny):
    for tie in (False, True):
        model = load_model(tiny.directory("llama", tie, torch.bfloat16), max_len=32,
                           quantize="int8")
        w = model.weights
        assert w.embed.dtype == torch.bfloat16
        assert isinstance(w.lm_head, Int8Weight)  # tied: its own INT8 copy of the embedding
        for layer in w.layers:
            assert all(isinstance(x, Int8Weight) for x in (layer.qkv, layer.o, layer.up,
                                                           layer.down))
        bf16 = load_model(tiny.directory("llama", tie, torch.bfloat16), max_len=32)
        # INT8 linears take half the bytes of bf16 (plus one float32 scale per row); the bf16
        # embedding stays, and a tied lm_head adds its INT8 copy.
        assert weight_bytes(model) < weight_bytes(bf16) * (0.65 if tie else 0.6)


def _greedy_tokens(model, cache, prompt, steps):
    seq = cache.new_sequence()
    logits, tokens = forward(model, cache, seq, prompt), []
    for _ in range(steps):
        tokens.append(int(logits[-1].argmax()))
        logits = forward(model, cache, seq, [tokens[-1]])
    return tokens


def _trajectory_logits(model, cache, prompt, tokens):
    seq = cache.new_sequence()
    rows = [forward(model, cache, seq, prompt)[-1]]
    for token in tokens[:-1]:
        rows.append(forward(model, cache, seq, [token])[-1])
    return torch.stack(rows).cpu()


def _compare(test, base, max_bound, mean_bound):
    scale = base.abs().max().item()
    diff = (test - base).abs()
    agree = (test.argmax(-1) == base.argmax(-1)).float().mean().item()
    assert diff.max().item() <= max_bound * scale, f"max diff {diff.max():.3g} at scale {scale:.3g}"
    assert diff.mean().item() <= mean_bound * scale, f"mean diff {diff.mean():.3g}"
    assert agree >= 0.85, f"greedy picks agree at {agree:.0%} of the steps"
    assert diff.max().item() > 0  # the quantized path really ran


@pytest.mark.parametrize("arch,tie", [(arch, False) for arch in ARCHS] + [("qwen3", True)])
def test_int8_weights_stay_close_to_bf16(tiny, arch, tie):
    directory = tiny.directory(arch, tie, torch.bfloat16)
    base = load_model(directory, max_len=128)
    int8 = load_model(directory, max_len=128, quantize="int8")
    prompt = prompt_ids()
    tokens = _greedy_tokens(base, new_cache(base), prompt, STEPS)
    _compare(_trajectory_logits(int8, new_cache(int8), prompt, tokens),
             _trajectory_logits(base, new_cache(base), prompt, tokens),
             max_bound=0.065, mean_bound=0.012)


@pytest.mark.parametrize("arch", ARCHS)
def test_int8_kv_pages_stay_close_to_bf16(tiny, arch):
    directory = tiny.directory(arch, False, torch.bfloat16)
    model = load_model(directory, max_len=128)
    prompt = prompt_ids()
    tokens = _greedy_tokens(model, new_cache(model), prompt, STEPS)
    base = _trajectory_logits(model, new_cache(model), prompt, tokens)
    smoothing = calibrate_key_smoothing(model, prompt_ids(64, seed=9))
    for key_smoothing in (None, smoothing):
        cache = new_cache(model, quantize="int8", key_smoothing=key_smoothing)
        assert cache.k_pages.dtype == torch.int8 and cache.k_scales.dtype == torch.float32
        _compare(_trajectory_logits(model, cache, prompt, tokens), base,
                 max_bound=0.045, mean_bound=0.0065)


def test_key_smoothing_needs_an_int8_cache(tiny):
    model = load_model(tiny.directory("llama", False, torch.bfloat16), max_len=32)
    smoothing = calibrate_key_smoothing(model, prompt_ids(16))
    with pytest.raises(ValueError, match="key_smoothing applies to an INT8 cache only"):
        new_cache(model, key_smoothing=smoothing)
    with pytest.raises(ValueError, match="one \\(kv_heads, head_dim\\)"):
        new_cache(model, quantize="int8", key_smoothing=smoothing[:1])
