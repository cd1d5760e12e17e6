"""FP8 weights (quantize="fp8") and the FP8 product of the linear ops.

The quantization is checked against an independent table of every finite e4m3 value (nearest
value, ties to the even bit pattern) and the product against a float64 sum; a model loaded with
quantize="fp8" stores e4m3 linears (the LM head stays bf16) and stays near the bf16 model.

Measured on the tiny models (bf16 model, 20-token prompt, 40 greedy steps teacher-forced along
the bf16 model's own trajectory), logit scale s = max |bf16 logit| ~ 3-4:

                      max |logit diff|   mean |diff|      greedy picks agree
  INT8 weights        0.022-0.031 s      0.004-0.006 s    97.5-100%
  FP8 (W8A8)          0.100-0.159 s      0.018-0.026 s    70-87.5%

e4m3 keeps 3 fraction bits (a relative error of up to 2**-4 per element, for both operands),
where per-channel INT8 of Gaussian weights errs by about 1/250 of the row's largest value: FP8
trades precision for range, and these small random models show it. The test asserts about 1.4x
the measured error and 60% agreement; a broken path (a scale dropped, rows mixed) is far off.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backend.fp8 import E4M3, E4M3_MAX, fp8_matmul, quantize_rows, row_scales
from tileinfer.backend import BackendInfo, hookimpl
from tileinfer.backend.registry import get_backend, registry
from tileinfer.engine.kv.cache import new_cache
from tileinfer.engine.memory import memory_report
from tileinfer.model import load_model
from tileinfer.model.quant import Fp8Weight, quantize_fp8
from tileinfer.model.weights import expected_weight_bytes, weight_bytes
from test_quant import _greedy_tokens, _trajectory_logits
from tiny_models import ARCHS, prompt_ids, tiny  # noqa: F401


def _e4m3_table() -> torch.Tensor:
    """Every finite e4m3 value, from the 256 bit patterns, sorted, as float64."""
    values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(E4M3).double()
    return torch.unique(values[values.isfinite()])


def _nearest_e4m3(v: torch.Tensor) -> torch.Tensor:
    """The e4m3 value nearest each element of v (float64), ties to the even bit pattern."""
    table = _e4m3_table()
    v = v.double().clamp(-E4M3_MAX, E4M3_MAX)
    dist = (v[..., None] - table).abs()
    best = dist.min(-1, keepdim=True).values
    ties = dist == best
    # among equally near values take the one whose bit pattern is even
    patterns = table.to(E4M3).view(torch.uint8).int()
    even = ties & (patterns % 2 == 0)
    pick = torch.where(even.any(-1, keepdim=True), even, ties).float().argmax(-1)
    return table[pick]


def test_row_quantization_is_the_nearest_e4m3_of_x_over_its_row_scale():
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(6, 96, generator=gen) * torch.logspace(-4, 3, 6)[:, None]).bfloat16()
    x[4] = 0.0
    q, scale = quantize_rows(x)
    assert q.dtype == E4M3 and scale.dtype == torch.float32 and scale.shape == (6,)
    amax = x.float().abs().amax(1)
    assert torch.equal(scale[amax > 0], amax[amax > 0] / 448) and scale[4] == 1.0
    expected = _nearest_e4m3(x.float() / scale[:, None])
    assert torch.equal(q.double(), expected)
    # each row's largest magnitude is 448 exactly
    assert torch.equal(q.float().abs().amax(1)[amax > 0], torch.full((5,), 448.0))


def test_fp8_product_is_the_scaled_sum_of_the_e4m3_products():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 200, generator=gen).bfloat16()
    w = quantize_fp8(torch.randn(40, 200, generator=gen) * 0.05)
    xq, xs = quantize_rows(x)
    exact = (xq.double() @ w.q.double().T) * xs.double()[:, None] * w.scale.double()[None, :]
    got = fp8_matmul(x, w.q, w.scale)
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-6)
    # the ref backend's linear op rounds it once to bf16
    out = torch.empty(3, 40, dtype=torch.bfloat16)
    get_backend("ref").linear(out, x, w.q, w.scale, True)
    assert torch.equal(out, got.bfloat16())


def test_quantize_fp8_weights_per_output_channel():
    gen = torch.Generator().manual_seed(2)
    w = (torch.randn(32, 64, generator=gen) * torch.logspace(-3, 1, 32)[:, None]).bfloat16()
    fw = quantize_fp8(w)
    assert isinstance(fw, Fp8Weight) and fw.q.dtype == E4M3 and fw.q.shape == w.shape
    assert torch.equal(fw.scale, row_scales(w))
    # e4m3 keeps 3 fraction bits: within 2**-4 of each element, relative (normal values), or
    # half the smallest subnormal step (2**-10 of the scale) absolute.
    err = (fw.dequantize() - w.float()).abs()
    bound = torch.maximum(w.float().abs() * 2.0 ** -4, fw.scale[:, None] * 2.0 ** -10)
    assert bool((err <= bound * (1 + 1e-6)).all())


@pytest.mark.parametrize("tie", [False, True])
def test_fp8_model_stores_e4m3_linears_and_keeps_the_lm_head(tiny, tie):
    directory = tiny.directory("llama", tie, torch.bfloat16)
    model = load_model(directory, max_len=32, quantize="fp8")
    w = model.weights
    for layer in w.layers:
        assert all(isinstance(x, Fp8Weight) for x in (layer.qkv, layer.o, layer.up, layer.down))
    assert w.lm_head.dtype == torch.bfloat16 and (w.lm_head is w.embed) == tie
    assert weight_bytes(model) == expected_weight_bytes(model.config, torch.bfloat16, "fp8")
    bf16 = load_model(directory, max_len=32)
    report = memory_report(model)
    assert report["weights"] == "fp8"
    assert report["linear_weight_bytes"] < memory_report(bf16)["linear_weight_bytes"]


@pytest.mark.parametrize("arch", ARCHS)
def test_fp8_weights_stay_close_to_bf16(tiny, arch):
    directory = tiny.directory(arch, False, torch.bfloat16)
    base = load_model(directory, max_len=128)
    fp8 = load_model(directory, max_len=128, quantize="fp8")
    prompt = prompt_ids()
    tokens = _greedy_tokens(base, new_cache(base), prompt, 40)
    test = _trajectory_logits(fp8, new_cache(fp8), prompt, tokens)
    ref = _trajectory_logits(base, new_cache(base), prompt, tokens)
    scale = ref.abs().max().item()
    diff = (test - ref).abs()
    assert 0 < diff.max().item() <= 0.22 * scale, f"max diff {diff.max():.3g} at scale {scale:.3g}"
    assert diff.mean().item() <= 0.036 * scale, f"mean diff {diff.mean():.3g}"
    agree = (test.argmax(-1) == ref.argmax(-1)).float().mean().item()
    assert agree >= 0.6, f"greedy picks agree at {agree:.0%} of the steps"


class _NoFp8Backend:
    """A backend whose info does not declare FP8 linear ops (every op falls back to ref)."""

    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="no-fp8", available=True, devices=("cpu",))


@pytest.fixture
def no_fp8_backend():
    reg = registry()
    reg.register(_NoFp8Backend())
    yield "no-fp8"
    reg.unregister("no-fp8")


def test_fp8_needs_a_backend_that_declares_it(tiny, no_fp8_backend):
    directory = tiny.directory("llama", False, torch.bfloat16)
    with pytest.raises(ValueError, match="must be None, 'int8', 'fp8' or 'fp8-weight-only'"):
        load_model(directory, max_len=32, quantize="fp4")
    with pytest.raises(ValueError, match=r"does not declare fp8 linear ops \(BackendInfo.fp8\)"):
        load_model(directory, max_len=32, quantize="fp8", backend=no_fp8_backend, device="cpu")
    with pytest.raises(ValueError, match=r"fp8-weight-only linear ops \(BackendInfo.fp8_weight"):
        load_model(directory, max_len=32, quantize="fp8-weight-only", backend=no_fp8_backend,
                   device="cpu")

