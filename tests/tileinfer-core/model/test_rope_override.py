"""A RoPE dict given at load time (``load_model(rope_scaling=...)``, the CLI's --rope-scaling)
in place of config.json's: a plain tiny Qwen3 loaded with YaRN computes what transformers
computes for the same model saved with YaRN; the model's rope_theta is kept, YaRN's stretched
length becomes its positions, and bad overrides are one ConfigError."""

from __future__ import annotations

import json

import pytest
import torch

from tileinfer.engine.generation.forward import forward
from tileinfer.engine.kv.cache import new_cache
from tileinfer.model import load_model
from tileinfer.model.config import (ConfigError, check_max_len, load_config,
                                    model_positions)
from tiny_models import YARN_ROPE, single_torch_thread, tiny  # noqa: F401


def test_a_plain_model_with_a_yarn_override_matches_transformers_with_yarn(tiny):
    ref = tiny.reference("qwen3", rope=YARN_ROPE)  # transformers on the model saved with YaRN
    plain = tiny.directory("qwen3")  # the same weights saved without scaling
    assert load_config(plain).rope_scaling is None
    model = load_model(plain, dtype=torch.float32, backend="ref", max_len=64,
                       rope_scaling=YARN_ROPE)
    saved = load_config(tiny.directory("qwen3", rope=YARN_ROPE))
    assert (model.config.rope_scaling, model.config.rope_theta) == (saved.rope_scaling,
                                                                    saved.rope_theta)
    cache = new_cache(model, 64, page_size=16)
    logits = forward(model, cache, cache.new_sequence(), ref.prompt, all_logits=True).cpu()
    assert (logits - ref.prefill_logits).abs().max().item() <= 1e-4
    unscaled = load_model(plain, dtype=torch.float32, backend="ref", max_len=64)
    cache = new_cache(unscaled, 64, page_size=16)
    other = forward(unscaled, cache, cache.new_sequence(), ref.prompt, all_logits=True).cpu()
    assert (other - ref.prefill_logits).abs().max().item() > 1e-2  # the override mattered


def _write(tmp_path, **fields):
    d = dict(model_type="qwen3", vocab_size=512, hidden_size=256, intermediate_size=512,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             max_position_embeddings=40960, **fields)
    (tmp_path / "config.json").write_text(json.dumps(d))
    return tmp_path


@pytest.mark.parametrize("form", ["rope_theta", "rope_parameters"])
def test_the_model_theta_stays_and_yarn_stretches_the_positions(tmp_path, form):
    theta = 250000.0
    fields = ({"rope_theta": theta} if form == "rope_theta"
              else {"rope_parameters": {"rope_type": "default", "rope_theta": theta}})
    folder = _write(tmp_path, **fields)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    config = load_config(folder, yarn)
    assert config.rope_theta == theta
    assert config.rope_scaling["rope_type"] == "yarn" and config.rope_scaling["factor"] == 4.0
    assert model_positions(config) == (4 * 32768,
                                       "YaRN's factor x original_max_position_embeddings")
    check_max_len(config, 4 * 32768)
    with pytest.raises(ConfigError, match="exceeds the model's 131072 positions"):
        check_max_len(config, 4 * 32768 + 1)
    # A stretch shorter than the model's own positions leaves them; a theta given wins.
    config = load_config(folder, {**yarn, "factor": 1.0, "rope_theta": 1e6})
    assert model_positions(config) == (40960, "config field 'max_position_embeddings'")
    assert config.rope_theta == 1e6


def test_yarn_in_config_json_stretches_the_positions_too(tmp_path):
    yarn = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
            "original_max_position_embeddings": 32768}
    config = load_config(_write(tmp_path, rope_scaling=yarn))
    assert config.max_position_embeddings == 40960  # the field as transformers reads it
    assert model_positions(config)[0] == 4 * 32768
    with pytest.raises(ConfigError, match=r"131073 exceeds the model.s 131072 positions \(YaRN"):
        check_max_len(config, 4 * 32768 + 1)


def test_a_default_override_turns_scaling_off(tmp_path):
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    folder = _write(tmp_path, rope_scaling=llama3)
    assert load_config(folder).rope_scaling["rope_type"] == "llama3"
    config = load_config(folder, {"rope_type": "default"})
    assert config.rope_scaling is None and config.rope_theta == 500000.0


@pytest.mark.parametrize("override, message", [
    ({"rope_type": "yarn"}, "'rope_scaling.factor' is required"),
    ({"rope_type": "yarn", "factor": "four"}, "rope_scaling.factor"),
    ({"rope_type": "dynamic", "factor": 2.0}, "'rope_scaling.rope_type' is 'dynamic'"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_overrides_are_one_clear_error(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(_write(tmp_path, rope_theta=1e6), override)


def test_gemma3_refuses_an_override(tiny):
    with pytest.raises(ConfigError, match="not supported for Gemma 3"):
        load_config(tiny.directory("gemma3"), {"rope_type": "linear", "factor": 2.0})
