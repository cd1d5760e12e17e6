"""The Triton FP8 path (kernels/linear_fp8.py) beyond the conformance suite's products: the
per-token quantization kernel gives the e4m3 bits and scales of ``tileinfer.backend.fp8`` (ties to
even, subnormals, signed zeros, an all-zero row), and a tiny model with FP8 weights decodes as the
ref backend's does.

They run wherever the triton backend declares FP8: under ``TRITON_INTERPRET=1`` on the CPU (CI)
and on a GPU of compute capability 8.9 or newer.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tileinfer.backend.fp8 import E4M3, quantize_rows
from tileinfer.backend.hookspecs import Invariance
from tileinfer.backend.registry import BackendError, get_backend
from tileinfer.engine.kv.cache import new_cache
from tileinfer.engine.generation.forward import forward
from tileinfer.model import load_model
from tiny_models import prompt_ids, tiny  # noqa: F401

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def triton_fp8():
    try:
        ops = get_backend("triton")
    except BackendError as exc:
        pytest.skip(str(exc))
    if not ops.backend.info.fp8:
        pytest.skip("the triton backend does not declare FP8 here")
    return ops


def kernel_quantize(x: torch.Tensor):
    from tileinfer_backend_triton.kernels.linear_fp8 import _quantize_rows_kernel

    n, k = x.shape
    xq = torch.empty(n, k, dtype=E4M3, device=x.device)
    scale = torch.empty(n, dtype=torch.float32, device=x.device)
    _quantize_rows_kernel[(n,)](x, x.stride(0), xq, scale, k, BLOCK_K=64)
    return xq, scale


def greedy_logits(model, prompt, steps):
    """The greedy tokens after prompt and the logits (steps, vocab) that picked them."""
    cache = new_cache(model)
    seq = cache.new_sequence()
    logits, tokens, rows = forward(model, cache, seq, prompt), [], []
    for _ in range(steps):
        rows.append(logits[-1].float().cpu())
        tokens.append(int(logits[-1].argmax()))
        logits = forward(model, cache, seq, [tokens[-1]])
    return tokens, torch.stack(rows)


def test_quantization_gives_the_reference_bits(triton_fp8):
    gen = torch.Generator().manual_seed(0)
    rows = [torch.randn(200, generator=gen) * s for s in (1e-3, 1.0, 30.0)]
    # Scale 1 (the row's largest value is 448), so each value below is its own quotient: ties
    # between e4m3 neighbours (96 | 104, 1 | 1.125, subnormal steps of 2**-9), values under half
    # the smallest subnormal, negative values that round to -0, and a negative zero.
    special = torch.tensor([448.0, 100.0, -100.0, 1.0625, -1.1875, 1.5 * 2**-9, 2.5 * 2**-9,
                            0.5 * 2**-9, 0.4 * 2**-9, -0.3 * 2**-9, -0.0, 447.0, 2**-6, 0.0])
    rows.append(torch.cat([special, torch.zeros(200 - special.numel())]))
    rows.append(torch.zeros(200))  # scale 1, every value 0
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.stack(rows).to(dtype).to(DEVICE)
        xq, scale = kernel_quantize(x)
        ref_q, ref_scale = quantize_rows(x)
        assert torch.equal(scale, ref_scale)
        assert torch.equal(xq.view(torch.uint8), ref_q.view(torch.uint8)), dtype


def test_a_fp8_model_decodes_as_on_ref(triton_fp8, tiny):
    directory = tiny.directory("llama", False, torch.bfloat16)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    load = dict(max_len=64, quantize="fp8", dtype=dtype)
    ref = load_model(directory, backend="ref", device=DEVICE, **load)
    tri = load_model(directory, backend="triton", device=DEVICE, **load)
    prompt = prompt_ids(12, seed=3)
    want_tokens, want = greedy_logits(ref, prompt, 6)
    tokens, got = greedy_logits(tri, prompt, 6)
    assert tokens == want_tokens
    # The same e4m3 operands on both; only the order of the float32 sums differs.
    assert (got - want).abs().max().item() <= 2e-2 * want.abs().max().item()


@pytest.mark.parametrize("config", [(16, 256, 4, 4), (32, 64, 8, 2)], ids=str)
def test_a_forced_tile_config_keeps_each_rows_bits(triton_fp8, config):
    # FP8_TABLE's entries (a benchmark's winners) change the K tiles: a row's sums must still be
    # the same bits alone and among 16 or 40 rows, and the product the ref backend's.
    from tileinfer_backend_triton.kernels.linear_fp8 import Fp8Config, launch_fp8

    gen = torch.Generator().manual_seed(1)
    w, scale = quantize_rows(torch.randn(48, 320, generator=gen).to(DEVICE))  # e4m3, row scales
    x = torch.randn(40, 320, generator=gen).to(torch.bfloat16).to(DEVICE)
    cfg = Fp8Config(*config)

    def product(rows, invariant):
        out = torch.empty(rows.shape[0], 48, dtype=torch.bfloat16, device=DEVICE)
        launch_fp8(out, rows, w, scale, invariant=invariant, config=cfg)
        return out

    alone = torch.cat([product(x[i:i + 1], True) for i in range(40)])
    assert torch.equal(product(x[:16], True), alone[:16])
    assert torch.equal(product(x, Invariance.BATCH), alone)
    want = torch.empty(40, 48, dtype=torch.bfloat16, device=DEVICE)
    get_backend("ref").linear(want, x, w, scale)
    error = (alone.float() - want.float()).abs().max().item()
    assert error <= 2e-2 * want.float().abs().max().item()


def test_norms_quantizing_give_the_same_logits(triton_fp8, tiny):
    """add_rmsnorm_e4m3 and the e4m3-input linear ops against the plain ops (each linear op
    quantizing its own input), in one model: the same tokens and logits, bit for bit."""
    directory = tiny.directory("llama", False, torch.bfloat16)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    model = load_model(directory, backend="triton", device=DEVICE, max_len=64, quantize="fp8",
                       dtype=dtype)
    assert model.e4m3_norms
    prompt = prompt_ids(10, seed=4)
    tokens, fused = greedy_logits(model, prompt, 5)
    plain_ops = copy.copy(model.ops)
    for op in ("add_rmsnorm_e4m3", "linear_e4m3_input", "linear_swiglu_e4m3_input"):
        setattr(plain_ops, op, None)
    model.ops = plain_ops
    assert not model.e4m3_norms
    plain_tokens, plain = greedy_logits(model, prompt, 5)
    assert tokens == plain_tokens and torch.equal(fused, plain)
