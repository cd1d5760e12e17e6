"""FP8 checkpoints (compressed-tensors float-quantized, per-channel or per-tensor scales, with or
without static input scales, or block scales; vLLM's quant_method "fp8", per tensor or with
DeepSeek-V3's block scales) load as their dequantized weights: tileinfer's fused weights equal
weight * weight_scale converted to the model's dtype, and the model's logits equal
transformers' on those dequantized weights. Other methods, a malformed block size and an FP8
tensor without its scale are refused with one clear error."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tileinfer import WeightsError, forward, load_model, new_cache
from tiny_models import build_tiny, save_tiny

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


BLOCK = (16, 24)  # block scales' (rows, cols): the tiny model's sizes are not all multiples


def block_quantized(w: torch.Tensor):
    """(e4m3 values, scale_inv (ceil(out / 16), ceil(in / 24)), the dequantized weight): one scale
    per BLOCK of w, as DeepSeek-V3's FP8 checkpoints store it."""
    (rows, cols), (bn, bk) = w.shape, BLOCK
    blocks = torch.nn.functional.pad(w, (0, -cols % bk, 0, -rows % bn))
    blocks = blocks.reshape(blocks.shape[0] // bn, bn, blocks.shape[1] // bk, bk)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp_min(1e-12)
    spread = scale.repeat_interleave(bn, 0)[:rows].repeat_interleave(bk, 1)[:, :cols]
    q = (w / spread).to(torch.float8_e4m3fn)
    return q, scale, q.float() * spread


def write_fp8(folder, strategy: str, method: str = "compressed-tensors", input_scale=False):
    """Rewrite a saved float32 checkpoint's linear weights as FP8 (e4m3) with scales (strategy
    "block": quant_method "fp8" with weight_block_size); returns the dequantized float32 weights
    by name (what the checkpoint means)."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    meant = {}
    for name in list(tensors):
        if not name.endswith(".weight") or name.split(".")[-2] not in LINEARS:
            continue
        w = tensors[name]
        if strategy == "block":  # vLLM's "fp8" names the block scales weight_scale_inv
            suffix = "_scale_inv" if method == "fp8" else "_scale"
            tensors[name], tensors[name + suffix], meant[name] = block_quantized(w)
            continue
        amax = w.abs().amax(dim=1, keepdim=True) if strategy == "channel" else w.abs().amax()
        scale = (amax / 448.0).reshape(-1, 1) if strategy == "channel" else (amax / 448.0).reshape(1)
        q = (w / scale).to(torch.float8_e4m3fn)
        tensors[name] = q
        tensors[name + "_scale"] = scale.to(torch.bfloat16).float()
        if input_scale:
            tensors[name[:-len("weight")] + "input_scale"] = torch.ones(1)
        meant[name] = q.float() * tensors[name + "_scale"]
    save_file(tensors, path)
    config = json.loads((folder / "config.json").read_text())
    if method == "fp8":
        config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                         "weight_block_size": None}  # as some configs write it
        if strategy == "block":
            config["quantization_config"]["weight_block_size"] = list(BLOCK)
    else:
        weights = {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True,
                   "dynamic": False}
        if strategy == "block":
            weights["block_structure"] = list(BLOCK)
        acts = {"num_bits": 8, "type": "float", "strategy": "tensor" if input_scale else "token",
                "dynamic": not input_scale, "symmetric": True}
        config["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": acts}}}
    (folder / "config.json").write_text(json.dumps(config))
    return meant


@pytest.fixture(scope="module")
def hf():
    return build_tiny("llama")


@pytest.mark.parametrize("strategy, method, input_scale",
                         [("channel", "compressed-tensors", False),
                          ("tensor", "compressed-tensors", True), ("tensor", "fp8", True),
                          ("block", "fp8", False), ("block", "compressed-tensors", False)])
def test_fp8_checkpoint_loads_its_dequantized_weights(hf, tmp_path, strategy, method, input_scale):
    folder = save_tiny(hf, tmp_path / "m")
    meant = write_fp8(folder, strategy, method, input_scale)
    model = load_model(folder, dtype=torch.float32, backend="ref", max_len=64)
    layer = model.weights.layers[0]
    p = "model.layers.0."
    q, k, v = (meant[p + f"self_attn.{n}.weight"] for n in ("q_proj", "k_proj", "v_proj"))
    assert torch.equal(layer.qkv, torch.cat([q, k, v]))
    assert torch.equal(layer.down, meant[p + "mlp.down_proj.weight"])
    gate, up = meant[p + "mlp.gate_proj.weight"], meant[p + "mlp.up_proj.weight"]
    assert torch.equal(layer.up, torch.cat([gate, up]))
    # transformers on the same dequantized weights gives the same logits
    reference = build_tiny("llama")
    state = reference.state_dict()
    for name, w in meant.items():
        state[name] = w
    reference.load_state_dict(state)
    ids = torch.tensor([[1, 17, 42, 99, 5]])
    with torch.no_grad():
        want = reference(ids).logits[0, -1]
    cache = new_cache(model, 64)
    got = forward(model, cache, cache.new_sequence(), ids[0].tolist())[-1]
    torch.testing.assert_close(got.float(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("quantization, message", [
    ({"quant_method": "fp8", "weight_block_size": [128]}, "block size .* two positive"),
    ({"quant_method": "gptq", "bits": 4}, "quantization method 'gptq' is not supported"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "pack-quantized"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "group"}}}},
     "strategy 'group'"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block",
                                          "block_structure": [128, 0]}}}},
     "block size .* two positive"),
])
def test_other_quantizations_are_refused_clearly(hf, tmp_path, quantization, message):
    folder = save_tiny(hf, tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match=message):
        load_model(folder, dtype=torch.float32, backend="ref", max_len=64)


def test_an_fp8_tensor_without_its_scale_is_refused(hf, tmp_path):
    folder = save_tiny(hf, tmp_path / "m")
    write_fp8(folder, "channel")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight_scale"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(WeightsError, match="down_proj.weight.*without a .*weight_scale"):
        load_model(folder, dtype=torch.float32, backend="ref", max_len=64)


@pytest.mark.parametrize("quantize", ["fp8", "fp8-weight-only"])
@pytest.mark.parametrize("strategy", ["channel", "tensor"])
def test_fp8_checkpoint_with_quantize_fp8_keeps_the_stored_values(tmp_path, hf, strategy,
                                                                  quantize):
    """quantize="fp8" (and "fp8-weight-only", whose linear ops take the same values as bits):
    the checkpoint's e4m3 values and scales as stored (stacked for the fused qkv and gate_up, a
    tensor scale repeated per row), not rounded a second time."""
    folder = save_tiny(hf, tmp_path / strategy, torch.float32)
    write_fp8(folder, strategy)
    stored = load_file(folder / "model.safetensors")
    model = load_model(folder, dtype=torch.bfloat16, max_len=64, quantize=quantize)
    layer = model.weights.layers[0]
    prefix = "model.layers.0."
    for fused, parts in ((layer.qkv, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                         (layer.o, ("self_attn.o_proj",)),
                         (layer.up, ("mlp.gate_proj", "mlp.up_proj")),
                         (layer.down, ("mlp.down_proj",))):
        q = torch.cat([stored[prefix + p + ".weight"] for p in parts])
        scale = torch.cat([stored[prefix + p + ".weight_scale"].float().reshape(-1).expand(
            stored[prefix + p + ".weight"].shape[0]) for p in parts])
        assert fused.q.dtype == (torch.float8_e4m3fn if quantize == "fp8" else torch.uint8)
        assert torch.equal(fused.q.view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(fused.scale, scale)
    # the model runs, near the dequantized checkpoint's logits (activations quantized too with
    # "fp8"; with "fp8-weight-only" only the dequantized weights' bf16 rounding differs)
    ref = load_model(folder, dtype=torch.bfloat16, max_len=64)
    prompt = list(range(3, 19))
    logits = []
    for m in (model, ref):
        cache = new_cache(m)
        logits.append(forward(m, cache, cache.new_sequence(), prompt))
    a, b = logits
    assert a.shape == b.shape and bool(torch.isfinite(a).all())
    bound = 0.2 if quantize == "fp8" else 0.05
    assert 0 < (a - b).abs().max() < bound * b.abs().max()


@pytest.mark.parametrize("method", ["fp8", "compressed-tensors"])
def test_block_scaled_checkpoint_with_quantize_fp8_is_quantized_again_per_row(tmp_path, hf,
                                                                              method):
    """Block scales have no per-row form: quantize="fp8" takes the dequantized weights in the
    model's dtype (stacked for the fused qkv and gate_up) and quantizes each row again."""
    from tileinfer.model.quant import quantize_fp8

    folder = save_tiny(hf, tmp_path / "block", torch.float32)
    meant = write_fp8(folder, "block", method)
    model = load_model(folder, dtype=torch.bfloat16, max_len=64, quantize="fp8")
    layer = model.weights.layers[0]
    prefix = "model.layers.0."
    for fused, parts in ((layer.qkv, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                         (layer.down, ("mlp.down_proj",))):
        want = quantize_fp8(torch.cat([meant[prefix + p + ".weight"] for p in parts])
                            .to(torch.bfloat16))
        assert torch.equal(fused.q.view(torch.uint8), want.q.view(torch.uint8))
        assert torch.equal(fused.scale, want.scale)
    cache = new_cache(model)
    logits = forward(model, cache, cache.new_sequence(), list(range(3, 19)))
    assert bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("strategy, method, activations, scheme",
                         [("channel", "compressed-tensors", True, "fp8"),
                          ("tensor", "fp8", True, "fp8"),
                          ("channel", "compressed-tensors", False, "fp8-weight-only"),
                          ("block", "fp8", True, None), ("block", "compressed-tensors", True, None)])
def test_stored_scheme_is_what_the_config_asks(hf, tmp_path, strategy, method, activations,
                                               scheme):
    """W8A8 where the config quantizes the activations, weight-only where it does not, None for
    block scales (no per-row form) and for an unquantized checkpoint."""
    from tileinfer.model.fp8_checkpoint import stored_scheme

    folder = save_tiny(hf, tmp_path / "m", torch.float32)
    assert stored_scheme(folder) is None
    write_fp8(folder, strategy, method)
    if not activations:
        config = json.loads((folder / "config.json").read_text())
        config["quantization_config"]["config_groups"]["group_0"]["input_activations"] = None
        (folder / "config.json").write_text(json.dumps(config))
    assert stored_scheme(folder) == scheme
