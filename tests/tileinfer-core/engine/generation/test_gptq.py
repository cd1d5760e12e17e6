"""GPTQ-rounded FP8 checkpoints (engine/generation/gptq.py): the rounding moves a layer's
outputs on its calibration inputs less than rounding to nearest does, and the written
checkpoint is one ``load_model`` reads, e4m3 as stored, with the quality that promises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tileinfer import forward, load_model, new_cache
from tileinfer.backend.fp8 import E4M3, quantize_rows
from tileinfer.engine.generation.gptq import gptq_e4m3, write_gptq_fp8
from tiny_models import build_tiny, prompt_ids, save_tiny


def test_gptq_moves_the_outputs_less_than_nearest_rounding():
    gen = torch.Generator().manual_seed(0)
    # Inputs with correlated channels and an outlier channel, as activations have.
    x = torch.randn(512, 64, generator=gen) @ torch.randn(64, 64, generator=gen) * 0.2
    x[:, 3] *= 20
    w = torch.randn(48, 64, generator=gen) * 0.05
    q, scale = gptq_e4m3(w, x.T @ x)
    assert q.dtype == E4M3 and scale.shape == (48,)
    nearest, nearest_scale = quantize_rows(w)
    assert torch.equal(scale, nearest_scale)  # the same per-row scales
    exact = x @ w.T
    gptq_error = (x @ (q.float() * scale[:, None]).T - exact).pow(2).mean()
    nearest_error = (x @ (nearest.float() * scale[:, None]).T - exact).pow(2).mean()
    assert gptq_error < 0.5 * nearest_error


@pytest.mark.parametrize("weight_only", [False, True], ids=["w8a8", "weight-only"])
@pytest.mark.parametrize("arch", ["llama", "phi3"])  # phi3: q/k/v and gate/up stored fused
def test_a_written_checkpoint_loads_and_stays_nearer_the_model(tmp_path, arch, weight_only):
    """For the W8A8 product (inputs quantized per token) or weight_only (inputs as they are,
    loaded with quantize="fp8-weight-only"): nearer the model than nearest rounding."""
    quantize = "fp8-weight-only" if weight_only else "fp8"
    folder = save_tiny(build_tiny(arch), tmp_path / "m")
    model = load_model(folder, dtype=torch.float32, backend="ref", max_len=128)
    # More calibration tokens than the widest layer's inputs (512): with fewer, the Hessian is
    # singular and the rounding fits the calibration text alone.
    calibration = [t for seed in range(20, 30) for t in prompt_ids(120, seed=seed)]
    out = write_gptq_fp8(model, tmp_path / "gptq", calibration, weight_only=weight_only)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format"] == "float-quantized"
    assert (config["config_groups"]["group_0"]["input_activations"] is None) == weight_only
    with safe_open(out / "model.safetensors", "pt") as f:
        fused = "self_attn.qkv_proj" if arch == "phi3" else "self_attn.k_proj"
        assert f.get_tensor(f"model.layers.1.{fused}.weight").dtype == E4M3
        assert f"model.layers.1.{fused}.weight_scale" in f.keys()
    gptq = load_model(out, dtype=torch.float32, backend="ref", max_len=128, quantize=quantize)
    nearest = load_model(folder, dtype=torch.float32, backend="ref", max_len=128,
                         quantize=quantize)
    with safe_open(out / "model.safetensors", "pt") as f:  # kept as stored, not rounded again
        stored = f.get_tensor("model.layers.0.self_attn.o_proj.weight")
    assert torch.equal(gptq.weights.layers[0].o.q.view(torch.uint8), stored.view(torch.uint8))

    def logits(m, ids):
        cache = new_cache(m, 128)
        return forward(m, cache, cache.new_sequence(), ids, all_logits=True)

    ids = prompt_ids(100, seed=13)  # text like the calibration's (random tokens), not in it
    want = logits(model, ids)
    gptq_error = (logits(gptq, ids) - want).pow(2).mean()
    nearest_error = (logits(nearest, ids) - want).pow(2).mean()
    assert gptq_error < nearest_error


def test_a_failed_write_leaves_the_folder_as_it_was(tmp_path, monkeypatch):
    """Written whole or not at all: a write that fails part way (a disk filling up) leaves the
    empty OUT folder empty and no staging folder; the next write fills it."""
    import errno

    import safetensors.torch

    folder = save_tiny(build_tiny("llama"), tmp_path / "m")
    model = load_model(folder, dtype=torch.float32, backend="ref", max_len=128)
    calibration = prompt_ids(64, seed=20)
    out = tmp_path / "place" / "out"
    out.mkdir(parents=True)
    real = safetensors.torch.save_file

    def fill_the_disk(tensors, path, *args, **kwargs):
        Path(path).write_bytes(b"part of it")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", fill_the_disk)
    with pytest.raises(OSError, match="No space left"):
        write_gptq_fp8(model, out, calibration)
    assert [p.name for p in out.parent.iterdir()] == ["out"] and not any(out.iterdir())
    monkeypatch.setattr(safetensors.torch, "save_file", real)
    assert write_gptq_fp8(model, out, calibration) == out
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert [p.name for p in out.parent.iterdir()] == ["out"]
