"""FP8 weight-only (quantize="fp8-weight-only"): e4m3 weights as bits, activations as they are.

The product is checked against a float64 sum of the decoded values; a model stores its linears
as bit patterns of the same values ``quantize="fp8"`` stores, keeps the LM head, and, since its
activations are not rounded to e4m3, stays nearer the bf16 model than the W8A8 product does.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backend.fp8 import E4M3, e4m3_values, fp8_weight_only_matmul
from tileinfer.backend.registry import get_backend
from tileinfer.engine.kv.cache import new_cache
from tileinfer.model import load_model
from tileinfer.model.quant import Fp8WeightOnly, quantize_fp8, quantize_linear
from tileinfer.model.weights import expected_weight_bytes, weight_bytes
from test_quant import _greedy_tokens, _trajectory_logits
from tiny_models import ARCHS, prompt_ids, tiny  # noqa: F401


def test_e4m3_values_decode_every_bit_pattern():
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    values = e4m3_values(bits)
    finite = values.isfinite()
    assert int(finite.sum()) == 254  # 0x7F and 0xFF are NaN
    # sign, 4 exponent bits (bias 7), 3 mantissa bits; subnormals m/8 * 2^-6
    b = bits.int()
    e, m = (b >> 3) & 0xF, (b & 7).double()
    magnitude = torch.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e.double() - 7))
    expected = torch.where(b >= 128, -magnitude, magnitude)
    assert torch.equal(values[finite].double(), expected[finite])


def test_weight_only_product_is_the_scaled_sum_of_exact_products():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 200, generator=gen).bfloat16()
    weight = torch.randn(40, 200, generator=gen) * 0.05
    w = quantize_linear(weight, "fp8-weight-only")
    assert isinstance(w, Fp8WeightOnly) and w.q.dtype == torch.uint8
    exact = (x.double() @ w.q.view(E4M3).double().T) * w.scale.double()[None, :]
    got = fp8_weight_only_matmul(x, w.q, w.scale)
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-6)
    out = torch.empty(5, 40, dtype=torch.bfloat16)
    get_backend("ref").linear(out, x, w.q, w.scale, True)
    assert torch.equal(out, got.bfloat16())
    # the same values quantize="fp8" stores, and their dequantized weight
    fp8 = quantize_fp8(weight)
    assert torch.equal(w.q, fp8.q.view(torch.uint8))
    assert torch.equal(w.dequantize(), fp8.dequantize())


@pytest.mark.parametrize("tie", [False, True])
def test_model_stores_e4m3_bits_and_keeps_the_lm_head(tiny, tie):
    directory = tiny.directory("llama", tie, torch.bfloat16)
    model = load_model(directory, max_len=32, quantize="fp8-weight-only")
    fp8 = load_model(directory, max_len=32, quantize="fp8")
    for layer, fp8_layer in zip(model.weights.layers, fp8.weights.layers):
        for name in ("qkv", "o", "up", "down"):
            w, ref = getattr(layer, name), getattr(fp8_layer, name)
            assert isinstance(w, Fp8WeightOnly) and w.q.dtype == torch.uint8
            assert torch.equal(w.q, ref.q.view(torch.uint8)) and torch.equal(w.scale, ref.scale)
    w = model.weights
    assert w.lm_head.dtype == torch.bfloat16 and (w.lm_head is w.embed) == tie
    assert weight_bytes(model) == expected_weight_bytes(model.config, torch.bfloat16,
                                                        "fp8-weight-only")


@pytest.mark.parametrize("arch", ARCHS)
def test_weight_only_is_nearer_bf16_than_w8a8(tiny, arch):
    """Along the bf16 model's greedy trajectory, the weight-only model's logits differ from the
    bf16 model's by less than the W8A8 model's do (mean over all logits), and stay close."""
    directory = tiny.directory(arch, False, torch.bfloat16)
    base = load_model(directory, max_len=128)
    prompt = prompt_ids()
    tokens = _greedy_tokens(base, new_cache(base), prompt, 40)
    ref = _trajectory_logits(base, new_cache(base), prompt, tokens)
    errors = {}
    for quantize in ("fp8", "fp8-weight-only"):
        model = load_model(directory, max_len=128, quantize=quantize)
        errors[quantize] = (_trajectory_logits(model, new_cache(model), prompt, tokens) - ref).abs()
    scale = ref.abs().max().item()
    wo, w8a8 = errors["fp8-weight-only"], errors["fp8"]
    assert 0 < wo.mean() < w8a8.mean(), f"{wo.mean():.3g} vs W8A8 {w8a8.mean():.3g}"
    assert wo.max().item() <= 0.22 * scale
