"""Weight loading: fusion, dtype, tying, sharded checkpoints, xIELU scalars, clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from tileinfer.model import load_model
from tileinfer.model.config import load_config
from tileinfer.model.weights import (INDEX_FILE, WeightsError, expected_weight_bytes,
                                     load_weights, weight_bytes)
from tiny_models import load_reference, save_tiny, single_torch_thread, tiny  # noqa: F401


def _state(tiny, arch, tie=False):
    return {k: v.detach() for k, v in tiny.model(arch, tie).state_dict().items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "apertus"])
def test_fused_weights_stack_transformers_tensors(tiny, arch):
    state = _state(tiny, arch)
    path = tiny.directory(arch, False, torch.float32)
    weights = load_weights(load_config(path), path, dtype=torch.float32)
    layer, p = weights.layers[1], "model.layers.1."
    assert torch.equal(layer.qkv, torch.cat([state[p + f"self_attn.{x}_proj.weight"]
                                             for x in "qkv"]))
    if arch == "apertus":
        assert torch.equal(layer.up, state[p + "mlp.up_proj.weight"])
        assert torch.equal(layer.attn_norm, state[p + "attention_layernorm.weight"])
        assert torch.equal(layer.mlp_norm, state[p + "feedforward_layernorm.weight"])
        assert torch.equal(layer.q_norm, state[p + "self_attn.q_norm.weight"])
    else:
        assert torch.equal(layer.up, torch.cat([state[p + "mlp.gate_proj.weight"],
                                                state[p + "mlp.up_proj.weight"]]))
        assert torch.equal(layer.attn_norm, state[p + "input_layernorm.weight"])
        assert layer.q_norm is None and layer.xielu is None
    if arch == "qwen2":
        assert torch.equal(layer.qkv_bias, torch.cat([state[p + f"self_attn.{x}_proj.bias"]
                                                      for x in "qkv"]))
    else:
        assert layer.qkv_bias is None
    assert torch.equal(layer.down, state[p + "mlp.down_proj.weight"])
    assert torch.equal(weights.lm_head, state["lm_head.weight"])


def test_dtype_conversion_rounds_like_torch(tiny):
    state = _state(tiny, "qwen3")
    path = tiny.directory("qwen3", False, torch.float32)
    weights = load_weights(load_config(path), path, dtype=torch.bfloat16)
    assert weights.embed.dtype == torch.bfloat16 and weights.layers[0].qkv.dtype == torch.bfloat16
    assert torch.equal(weights.layers[0].o, state["model.layers.0.self_attn.o_proj.weight"]
                       .to(torch.bfloat16))
    assert torch.equal(weights.layers[0].k_norm, state["model.layers.0.self_attn.k_norm.weight"]
                       .to(torch.bfloat16))


def test_tied_embeddings_are_shared(tiny):
    path = tiny.directory("llama", True, torch.bfloat16)
    assert "lm_head.weight" not in load_file(path / "model.safetensors")  # transformers omits it
    weights = load_weights(load_config(path), path, dtype=torch.bfloat16)
    assert weights.lm_head is weights.embed
    untied = tiny.directory("llama", False, torch.bfloat16)
    weights = load_weights(load_config(untied), untied, dtype=torch.bfloat16)
    assert weights.lm_head is not weights.embed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_xielu_scalars_are_transformers_effective_values(tiny, dtype):
    path = tiny.directory("apertus", False, dtype)
    weights = load_weights(load_config(path), path, dtype=dtype)
    reference = load_reference(path, dtype)
    for layer, hf_layer in zip(weights.layers, reference.model.layers):
        act = hf_layer.mlp.act_fn.requires_grad_(False)
        assert layer.xielu.alpha_p == float(F.softplus(act.alpha_p))
        assert layer.xielu.alpha_n == float(act.beta + F.softplus(act.alpha_n))
        assert layer.xielu.beta == float(act.beta) and layer.xielu.eps == float(act.eps)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_weight_bytes_counts_transformers_parameters_once(tiny, arch):
    for tie in (False, True):
        path = tiny.directory(arch, tie, torch.bfloat16)
        model = load_model(path, max_len=32)
        # transformers' parameters() lists a tied weight once, as weight_bytes counts it.
        n_params = sum(p.numel() for p in tiny.model(arch, tie).parameters())
        assert weight_bytes(model) == 2 * n_params
        assert expected_weight_bytes(load_config(path)) == 2 * n_params


def test_sharded_checkpoint_loads_like_a_single_file(tiny, tmp_path):
    sharded = save_tiny(tiny.model("qwen3"), tmp_path / "sharded", torch.float32,
                        max_shard_size="300KB")
    index = json.loads((sharded / INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) > 2, "the test needs several shards"
    single = tiny.directory("qwen3", False, torch.float32)
    config = load_config(single)
    a = load_weights(config, sharded, dtype=torch.float32)
    b = load_weights(config, single, dtype=torch.float32)
    assert all(torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors()))
    # A shard that the index lists but that is gone is a clear error.
    missing = sorted(set(index["weight_map"].values()))[1]
    (sharded / missing).unlink()
    with pytest.raises(WeightsError, match=f"{missing}.*does not exist"):
        load_weights(config, sharded, dtype=torch.float32)


# -- errors ----------------------------------------------------------------------------------

def _copy_model(tiny, tmp_path, arch="llama"):
    target = tmp_path / "model"
    shutil.copytree(tiny.directory(arch, False, torch.float32), target)
    return target


def _rewrite(path, change):
    tensors = load_file(path / "model.safetensors")
    change(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_missing_tensor_is_named(tiny, tmp_path):
    path = _copy_model(tiny, tmp_path)
    _rewrite(path, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(WeightsError, match="'model.layers.1.mlp.down_proj.weight' is missing"):
        load_model(path, dtype=torch.float32, max_len=32)


def test_missing_qkv_bias_is_named(tiny, tmp_path):
    path = _copy_model(tiny, tmp_path, "qwen2")
    _rewrite(path, lambda t: t.pop("model.layers.1.self_attn.v_proj.bias"))
    with pytest.raises(WeightsError, match="'model.layers.1.self_attn.v_proj.bias' is missing"):
        load_model(path, dtype=torch.float32, max_len=32)


def test_missing_xielu_scalar_is_named(tiny, tmp_path):
    path = _copy_model(tiny, tmp_path, "apertus")
    _rewrite(path, lambda t: t.pop("model.layers.0.mlp.act_fn.beta"))
    with pytest.raises(WeightsError, match="'model.layers.0.mlp.act_fn.beta' is missing"):
        load_model(path, dtype=torch.float32, max_len=32)


def test_wrong_tensor_shape_is_named_with_both_shapes(tiny, tmp_path):
    path = _copy_model(tiny, tmp_path)

    def shrink(tensors):
        name = "model.layers.0.self_attn.k_proj.weight"
        tensors[name] = tensors[name][:64].contiguous()
    _rewrite(path, shrink)
    with pytest.raises(WeightsError, match=r"'model.layers.0.self_attn.k_proj.weight' has shape "
                                           r"\[64, 256\], expected \[128, 256\]"):
        load_model(path, dtype=torch.float32, max_len=32)


@pytest.mark.parametrize("keep", [0.5, 0.001])
def test_truncated_safetensors_file_is_a_clear_error(tiny, tmp_path, keep):
    path = _copy_model(tiny, tmp_path)
    file = path / "model.safetensors"
    size = file.stat().st_size
    with open(file, "r+b") as f:
        f.truncate(max(4, int(size * keep)))
    with pytest.raises(WeightsError, match="model.safetensors is truncated or corrupt"):
        load_model(path, dtype=torch.float32, max_len=32)


def test_directory_without_weights_is_a_clear_error(tiny, tmp_path):
    path = _copy_model(tiny, tmp_path)
    (path / "model.safetensors").unlink()
    with pytest.raises(WeightsError, match="no \\*.safetensors files"):
        load_model(path, dtype=torch.float32, max_len=32)


def test_unknown_directory_is_a_clear_error(tmp_path):
    # Resolved by tileinfer.hub when it is installed (a repo id or a folder), else here.
    with pytest.raises(Exception, match="nope") as info:
        load_model(str(tmp_path / "nope"), max_len=32)
    assert type(info.value).__name__ in ("HubError", "FileNotFoundError")
