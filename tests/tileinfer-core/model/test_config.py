"""config.json reading: the real configs of ../shared/fixtures/models, both transformers forms,
RoPE tables, and clear errors. transformers' own reading of the same files is the reference."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from tileinfer.model import load_model
from tileinfer.model.config import (ConfigError, check_max_len, config_from_dict,
                                    default_max_len, load_config)
from tileinfer.model.rope import inverse_frequencies, rope_tables
from tileinfer.model.tensor_names import checkpoint_shapes
from tileinfer.model.weights import WeightsError
from tiny_models import COMMON, single_torch_thread, tiny  # noqa: F401

transformers.logging.set_verbosity_error()


def fixture_dirs(shared_dir):
    dirs = sorted(p.parent for p in (shared_dir / "fixtures" / "models").glob("*/config.json"))
    assert dirs, "no config.json among the fixtures"
    return dirs


def transformers_config(path):
    return transformers.AutoConfig.from_pretrained(path, local_files_only=True)


def _as_tuple(ids):
    return () if ids is None else tuple(ids) if isinstance(ids, (list, tuple)) else (ids,)


def _check_against_transformers(config, hf):
    """Every ModelConfig field against transformers' reading of the same config."""
    assert config.model_type == hf.model_type
    assert config.vocab_size == hf.vocab_size
    assert config.hidden_size == hf.hidden_size
    assert config.intermediate_size == hf.intermediate_size
    assert config.num_layers == hf.num_hidden_layers
    assert config.num_heads == hf.num_attention_heads
    assert config.num_kv_heads == hf.num_key_value_heads
    assert config.head_dim == (getattr(hf, "head_dim", None)
                               or hf.hidden_size // hf.num_attention_heads)
    assert config.rms_norm_eps == hf.rms_norm_eps
    assert config.max_position_embeddings == hf.max_position_embeddings
    assert config.tie_word_embeddings == hf.tie_word_embeddings
    assert config.eos_token_ids == _as_tuple(hf.eos_token_id)
    assert config.bos_token_id == hf.bos_token_id
    rope = hf.rope_parameters
    assert config.rope_theta == rope["rope_theta"]
    if rope["rope_type"] == "default":
        assert config.rope_scaling is None
    else:
        assert config.rope_scaling == {k: rope[k] for k in config.rope_scaling}


def _meta_model_shapes(hf):
    """Parameter and saved-buffer shapes of transformers' model for hf, built without memory."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if hf.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)  # tied: not saved
    return shapes


def test_real_configs_load_like_transformers(shared_dir):
    for path in fixture_dirs(shared_dir):
        config = load_config(path)
        hf = transformers_config(path)
        _check_against_transformers(config, hf)
        # The tensors the loader will ask for are exactly those of transformers' model.
        assert checkpoint_shapes(config, lm_head=not config.tie_word_embeddings) == \
            _meta_model_shapes(hf), path.name


# Qwen/Qwen2.5-0.5B's config.json as published (no Qwen2 folder among the shared fixtures).
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896,
    "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
    "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True,
    "use_mrope": False, "use_sliding_window": False, "vocab_size": 151936,
}


def test_qwen2_config_loads_like_transformers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_05B))
    config, hf = load_config(tmp_path), transformers_config(tmp_path)
    _check_against_transformers(config, hf)
    assert config.qkv_bias and not config.qk_norm and config.sliding_window is None
    # The q/k/v biases are among the tensors read, as in transformers' model.
    shapes = checkpoint_shapes(config, lm_head=False)
    assert shapes == _meta_model_shapes(hf)
    assert shapes["model.layers.3.self_attn.k_proj.bias"] == (128,)


# SmolLM3-3B's sizes (36 layers, every fourth without RoPE by the default interval); optional
# fields left to their defaults, which transformers fills in too.
SMOLLM3 = {"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "hidden_size": 2048,
           "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
           "num_key_value_heads": 4, "vocab_size": 128256, "max_position_embeddings": 65536,
           "rope_theta": 5000000.0, "rope_scaling": None, "eos_token_id": 128012,
           "pad_token_id": 128004, "use_sliding_window": False}


def test_smollm3_config_loads_like_transformers(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM3))
    config, hf = load_config(tmp_path), transformers_config(tmp_path)
    _check_against_transformers(config, hf)
    assert config.tie_word_embeddings  # SmolLM3's default
    assert config.rope_layers == tuple(bool(x) for x in hf.no_rope_layers)
    assert config.rope_layers[:8] == (True, True, True, False) * 2
    assert checkpoint_shapes(config, lm_head=False) == _meta_model_shapes(hf)
    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM3, "no_rope_layers": [1, 0] * 18}))
    assert load_config(tmp_path).rope_layers == (True, False) * 18
    with pytest.raises(ConfigError, match="'no_rope_layers' must list 0 or 1 for each of the 36"):
        config_from_dict({**SMOLLM3, "no_rope_layers": [1, 0]})


def test_granite_multipliers_read_like_transformers(tmp_path):
    """Granite 3's four scalings as transformers reads them; absent ones are 1."""
    given = dict(COMMON, model_type="granite", embedding_multiplier=12.0,
                 residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=8.0)
    (tmp_path / "config.json").write_text(json.dumps(given))
    config, hf = load_config(tmp_path), transformers_config(tmp_path)
    _check_against_transformers(config, hf)
    m = config.multipliers
    assert (m.embedding, m.residual, m.attention, m.logits) == (
        hf.embedding_multiplier, hf.residual_multiplier, hf.attention_multiplier,
        hf.logits_scaling)
    assert config.attention_scale == 0.0078125
    plain = config_from_dict(dict(COMMON, model_type="granite")).multipliers
    assert (plain.embedding, plain.residual, plain.attention, plain.logits) == (1, 1, 1, 1)
    assert config_from_dict(dict(COMMON, model_type="llama")).multipliers is None
    with pytest.raises(ConfigError, match="'logits_scaling' must be > 0"):
        config_from_dict({**given, "logits_scaling": 0})


def test_phi3_reads_like_transformers_and_refuses_what_it_cannot_run(tmp_path):
    """Phi-3-mini-4k's window (2047) bounds the default max_len, and every layer slides past it
    on a longer one; LongRoPE (Phi-3.5, the 128k models) and partial RoPE (Phi-4-mini) are
    refused, naming the field."""
    given = dict(COMMON, model_type="phi3", sliding_window=2047, rope_theta=10000.0,
                 pad_token_id=0, eos_token_id=2, max_position_embeddings=4096)
    (tmp_path / "config.json").write_text(json.dumps(given))
    config, hf = load_config(tmp_path), transformers_config(tmp_path)
    _check_against_transformers(config, hf)
    assert checkpoint_shapes(config) == _meta_model_shapes(hf)
    assert config.sliding_window == 2047
    assert default_max_len(config) == 2047  # what load_model takes when not told: exact
    check_max_len(config, 4096)
    assert config.layer_windows == (2047,) * config.num_layers
    longrope = {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}
    with pytest.raises(ConfigError, match="'rope_scaling.rope_type' is 'longrope'"):
        config_from_dict({**given, "rope_scaling": longrope})
    with pytest.raises(ConfigError, match="'partial_rotary_factor' is 0.75"):
        config_from_dict({**given, "partial_rotary_factor": 0.75})


def test_real_configs_rope_like_transformers(shared_dir):
    for path in fixture_dirs(shared_dir):
        config = load_config(path)
        hf = transformers_config(path)
        rotary = _rotary_class(hf)(hf)
        inv_freq, scaling = inverse_frequencies(config)
        assert torch.equal(inv_freq, rotary.inv_freq), path.name
        assert scaling == rotary.attention_scaling
        # The bf16 tables hold transformers' bf16 cos/sin (its tables repeat the half twice).
        positions = torch.tensor([[0, 1, 2, 1000, 8191, 20000]])
        x = torch.zeros(1, dtype=torch.bfloat16)
        cos_hf, sin_hf = rotary(x, positions)
        cos, sin = rope_tables(config, 20001, torch.bfloat16)
        half = config.head_dim // 2
        assert torch.equal(cos[positions[0]], cos_hf[0, :, :half].float()), path.name
        assert torch.equal(sin[positions[0]], sin_hf[0, :, half:].float()), path.name


def _rotary_class(hf):
    module = {"llama": transformers.models.llama.modeling_llama,
              "qwen2": transformers.models.qwen2.modeling_qwen2,
              "smollm3": transformers.models.smollm3.modeling_smollm3,
              "granite": transformers.models.granite.modeling_granite,
              "phi3": transformers.models.phi3.modeling_phi3,
              "qwen3": transformers.models.qwen3.modeling_qwen3,
              "mistral": transformers.models.mistral.modeling_mistral,
              "apertus": transformers.models.apertus.modeling_apertus}[hf.model_type]
    name = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mistral": "Mistral",
            "apertus": "Apertus", "smollm3": "SmolLM3", "granite": "Granite", "phi3": "Phi3"}
    return getattr(module, name[hf.model_type] + "RotaryEmbedding")


def _to_transformers5_form(d):
    """The transformers 5 form of a transformers 4 config.json: rope_theta and rope_scaling
    folded into rope_parameters (as transformers 5 writes it)."""
    d = dict(d)
    rope = dict(d.pop("rope_scaling", None) or {"rope_type": "default"})
    rope["rope_theta"] = d.pop("rope_theta")
    d["rope_parameters"] = rope
    return d


def test_transformers5_form_reads_like_transformers4_form(shared_dir, tmp_path):
    """The fixtures are in the transformers 4 form; each is rewritten into the 5 form here."""
    for path in fixture_dirs(shared_dir):
        v4 = json.loads((path / "config.json").read_text())
        v5 = _to_transformers5_form(v4)
        assert "rope_theta" not in v5 and "rope_scaling" not in v5
        assert config_from_dict(v5) == load_config(path), path.name
        (tmp_path / "config.json").write_text(json.dumps(v5))
        _check_against_transformers(config_from_dict(v5), transformers_config(tmp_path))


def test_tiny_configs_saved_by_transformers5_load(tiny):
    """transformers 5.17 writes rope_parameters; Apertus' default RoPE is llama3."""
    for arch in ("llama", "mistral", "qwen2", "qwen3", "apertus", "smollm3", "granite", "phi3"):
        path = tiny.directory(arch)
        assert "rope_parameters" in json.loads((path / "config.json").read_text())
        config = load_config(path)
        _check_against_transformers(config, transformers_config(path))
        assert config.qk_norm == (arch in ("qwen3", "apertus"))
        assert config.qkv_bias == (arch == "qwen2")
        assert config.rope_layers == ((True, False) if arch == "smollm3" else None)
        assert (config.multipliers is not None) == (arch == "granite")
        assert config.mlp == ("xielu" if arch == "apertus" else "swiglu")
    assert load_config(tiny.directory("apertus")).rope_scaling["rope_type"] == "llama3"


def test_a_fixture_model_without_weights_is_refused_without_downloading(shared_dir):
    path = shared_dir / "fixtures" / "models" / "Qwen3-0.6B"
    before = sorted(p.name for p in path.iterdir())
    with pytest.raises(WeightsError, match="no \\*.safetensors files"):
        load_model(path, dtype=torch.float32, max_len=16)
    assert sorted(p.name for p in path.iterdir()) == before


# -- errors ----------------------------------------------------------------------------------

def _tiny_dict(**changes):
    d = dict(COMMON, model_type="llama")
    d.update(changes)
    return {k: v for k, v in d.items() if v is not None}


def test_unknown_model_type_is_a_clear_error():
    with pytest.raises(ConfigError, match="'model_type' is 'gpt2', which is not supported"):
        config_from_dict(_tiny_dict(model_type="gpt2"))


def test_missing_model_type_is_a_clear_error():
    d = _tiny_dict()
    del d["model_type"]
    with pytest.raises(ConfigError, match="'model_type' is missing"):
        config_from_dict(d)


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "intermediate_size",
                                   "num_hidden_layers", "num_attention_heads"])
def test_missing_required_field_is_named(field):
    d = _tiny_dict()
    del d[field]
    with pytest.raises(ConfigError, match=f"'{field}' is missing"):
        config_from_dict(d)


def test_wrong_field_type_is_named():
    with pytest.raises(ConfigError, match="'hidden_size' must be an integer"):
        config_from_dict(_tiny_dict(hidden_size="256"))


def test_unsupported_rope_type_names_the_field():
    with pytest.raises(ConfigError, match="'rope_scaling.rope_type' is 'longrope'"):
        config_from_dict(_tiny_dict(rope_scaling={"rope_type": "longrope", "factor": 4.0,
                                                  "short_factor": [1.0], "long_factor": [1.0]}))
    with pytest.raises(ConfigError, match="'rope_parameters.rope_type' is 'dynamic'"):
        config_from_dict(_tiny_dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                     "rope_theta": 1e4}))


def test_llama3_rope_without_its_factor_names_the_field():
    with pytest.raises(ConfigError, match="'rope_scaling.factor' is required"):
        config_from_dict(_tiny_dict(rope_scaling={"rope_type": "llama3", "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0}))


@pytest.mark.parametrize("field", ["attention_bias", "mlp_bias"])
def test_biases_are_refused(field):
    with pytest.raises(ConfigError, match=f"'{field}' is true"):
        config_from_dict(_tiny_dict(**{field: True}))


def test_other_activation_is_refused():
    with pytest.raises(ConfigError, match="'hidden_act' is 'gelu'"):
        config_from_dict(_tiny_dict(hidden_act="gelu"))


def test_partial_rotary_is_refused():
    with pytest.raises(ConfigError, match="'partial_rotary_factor' is 0.5"):
        config_from_dict(_tiny_dict(partial_rotary_factor=0.5))


def test_a_mistral_window_shorter_than_max_len_slides_every_layer(tmp_path):
    """Within the window plain attention is exact (no windowed op); past it every layer runs
    attention_window (tests/integration/test_model_parity.py checks the logits)."""
    config = config_from_dict(_tiny_dict(model_type="mistral", sliding_window=64))
    assert config.layer_windows == (64,) * config.num_layers
    check_max_len(config, 128)
    assert config_from_dict(_tiny_dict(model_type="llama")).layer_windows is None
    # A null window (Mistral Nemo) is global attention.
    assert config_from_dict(_tiny_dict(model_type="mistral", sliding_window=None) |
                            {"sliding_window": None}).sliding_window is None


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_sliding_window_only_counts_when_enabled(model_type):
    off = config_from_dict(_tiny_dict(model_type=model_type, sliding_window=32))
    assert off.sliding_window is None
    on = config_from_dict(_tiny_dict(model_type=model_type, sliding_window=32,
                                     use_sliding_window=True))
    with pytest.raises(ConfigError, match="'sliding_window' is 32.*use_sliding_window layers "
                       "is not implemented"):
        check_max_len(on, 64)


def test_missing_or_invalid_config_json(tmp_path):
    with pytest.raises(ConfigError, match="no config.json"):
        load_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(tmp_path)


GEMMA3_1B = {  # google/gemma-3-1b-it's config.json (transformers 4's form)
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
    "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
    "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
    "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 262144}


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 8.0}],
                         ids=["1b", "linear-scaled"])
def test_gemma3_reads_like_transformers(scaling):
    """Gemma 3's layer pattern, RoPE bases and scaling, attention scale and stop ids, from the
    hub's form of config.json, as transformers reads them."""
    import transformers

    given = dict(GEMMA3_1B, rope_scaling=scaling)
    config = config_from_dict(given)
    hf = transformers.Gemma3TextConfig(**given)
    windows = [512 if t == "sliding_attention" else None for t in hf.layer_types]
    assert list(config.layer_windows) == windows and windows.count(None) == 4
    rope = hf.rope_parameters
    assert config.rope_theta == rope["full_attention"]["rope_theta"] == 1e6
    assert config.gemma.local_rope_theta == rope["sliding_attention"]["rope_theta"] == 1e4
    assert config.rope_scaling == (None if scaling is None else {"rope_type": "linear",
                                                                 "factor": 8.0})
    assert rope["full_attention"]["rope_type"] == ("default" if scaling is None else "linear")
    assert config.attention_scale == hf.query_pre_attn_scalar ** -0.5 == 1 / 16
    assert config.eos_token_ids == (1, 106) and config.tie_word_embeddings
    assert (config.mlp, config.qk_norm, config.sliding_window) == ("geglu", True, None)
    check_max_len(config, 32768)  # the local layers' window runs on attention_window
    with pytest.raises(ConfigError, match="'final_logit_softcapping' is 30.0"):
        config_from_dict(dict(given, final_logit_softcapping=30.0))


def test_a_multimodal_gemma3_config_reads_as_its_text_model():
    """google/gemma-3-4b-it's config.json states a few text fields; the rest are transformers'
    defaults, the token ids the outer config's."""
    import transformers

    given = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
             "boi_token_index": 255999, "eoi_token_index": 256000, "eos_token_id": [1, 106],
             "image_token_index": 262144, "mm_tokens_per_image": 256,
             "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                             "model_type": "gemma3_text", "num_hidden_layers": 34,
                             "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                             "sliding_window": 1024},
             "vision_config": {"hidden_size": 1152, "image_size": 896,
                               "intermediate_size": 4304, "model_type": "siglip_vision_model",
                               "num_attention_heads": 16, "num_hidden_layers": 27,
                               "patch_size": 14, "vision_use_head": False}}
    config = config_from_dict(given)
    hf = transformers.Gemma3Config(**given).text_config
    assert (config.vocab_size, config.num_heads, config.num_kv_heads, config.head_dim) == \
        (hf.vocab_size, hf.num_attention_heads, hf.num_key_value_heads, hf.head_dim)
    assert list(config.layer_windows) == [1024 if t == "sliding_attention" else None
                                          for t in hf.layer_types]
    assert config.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert config.rope_theta == hf.rope_parameters["full_attention"]["rope_theta"]
    assert config.eos_token_ids == (1, 106) and config.tie_word_embeddings


# -- YaRN ------------------------------------------------------------------------------------

# A Qwen3 of Qwen3's heads (128) and RoPE base with YaRN over a short original context (so that
# the kept, blended and interpolated pairs all occur), and a variant for each optional field.
YARN_QWEN3 = dict(COMMON, model_type="qwen3", head_dim=128, max_position_embeddings=256)
YARN_VARIANTS = {
    "factor-only": {"factor": 4.0, "original_max_position_embeddings": 64},
    "attention-factor": {"factor": 4.0, "original_max_position_embeddings": 64,
                         "attention_factor": 0.8},
    "mscale": {"factor": 40.0, "original_max_position_embeddings": 64, "mscale": 0.707,
               "mscale_all_dim": 1.0},
    "zero-mscale": {"factor": 40.0, "original_max_position_embeddings": 64, "mscale": 1.0,
                    "mscale_all_dim": 0.0},  # transformers: as if absent
    "betas": {"factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 16.0,
              "beta_slow": 2.0},
    "untruncated": {"factor": 4.0, "original_max_position_embeddings": 64, "truncate": False},
    "null-factor": {"factor": None, "original_max_position_embeddings": 64},  # 256 / 64
    "no-original": {"factor": 4.0},  # original: max_position_embeddings
}


def _yarn_config_json(fields, form, rope_theta=1000000.0):
    """config.json of YARN_QWEN3 with a yarn dict of ``fields``, in transformers 5's form
    (rope_parameters) or 4's (rope_scaling and a top-level rope_theta)."""
    if form == "rope_parameters":
        rope = {"rope_type": "yarn", "rope_theta": rope_theta, **fields}
        return dict(YARN_QWEN3, rope_parameters=rope)
    return dict(YARN_QWEN3, rope_theta=rope_theta, rope_scaling={"type": "yarn", **fields})


def _hf_qwen3(given):
    return transformers.Qwen3Config(**{k: v for k, v in given.items() if k != "model_type"})


@pytest.mark.parametrize("form", ["rope_parameters", "rope_scaling"])
def test_yarn_config_reads_like_transformers(form, tmp_path):
    """Qwen3's long-context setting: transformers' reading of the same config.json, with
    transformers' defaults where it leaves a field out; both forms read alike."""
    given = _yarn_config_json({"factor": 4.0, "original_max_position_embeddings": 64}, form)
    config = config_from_dict(given)
    assert config.rope_scaling == {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True, "attention_factor": None,
        "mscale": None, "mscale_all_dim": None}
    (tmp_path / "config.json").write_text(json.dumps(given))
    hf = transformers_config(tmp_path)
    assert hf.rope_parameters["rope_type"] == "yarn"
    assert config.rope_theta == hf.rope_parameters["rope_theta"] == 1e6
    assert {k: config.rope_scaling[k] for k in ("factor", "original_max_position_embeddings")} \
        == {k: hf.rope_parameters[k] for k in ("factor", "original_max_position_embeddings")}
    other = "rope_scaling" if form == "rope_parameters" else "rope_parameters"
    assert config == config_from_dict(_yarn_config_json(
        {"factor": 4.0, "original_max_position_embeddings": 64}, other))
    # What transformers fills in: the original length from max_position_embeddings, a null
    # factor from the two lengths.
    assert config_from_dict(_yarn_config_json({"factor": 4.0}, form)).rope_scaling[
        "original_max_position_embeddings"] == 256
    assert config_from_dict(_yarn_config_json(YARN_VARIANTS["null-factor"], form)).rope_scaling[
        "factor"] == 4.0


@pytest.mark.parametrize("form", ["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize("variant", list(YARN_VARIANTS))
def test_yarn_rope_like_transformers(variant, form):
    """inv_freq and the attention scaling are transformers' ROPE_INIT_FUNCTIONS["yarn"] on the
    same config, bit for bit, and the bf16 tables hold Qwen3RotaryEmbedding's cos and sin."""
    given = _yarn_config_json(YARN_VARIANTS[variant], form)
    config, hf = config_from_dict(given), _hf_qwen3(given)
    inv_freq, scaling = inverse_frequencies(config)
    inv_freq_hf, scaling_hf = ROPE_INIT_FUNCTIONS["yarn"](hf, None)
    assert torch.equal(inv_freq, inv_freq_hf)
    assert scaling == scaling_hf
    plain, _ = inverse_frequencies(config_from_dict(dict(YARN_QWEN3, rope_theta=1e6)))
    assert not torch.equal(inv_freq, plain)  # the scaling changes something
    rotary = transformers.models.qwen3.modeling_qwen3.Qwen3RotaryEmbedding(hf)
    positions = torch.tensor([[0, 1, 2, 63, 64, 255, 1000]])
    cos_hf, sin_hf = rotary(torch.zeros(1, dtype=torch.bfloat16), positions)
    cos, sin = rope_tables(config, 1001, torch.bfloat16)
    half = config.head_dim // 2
    assert torch.equal(cos[positions[0]], cos_hf[0, :, :half].float())
    assert torch.equal(sin[positions[0]], sin_hf[0, :, half:].float())


ABSENT = object()  # a field left out of the yarn dict


@pytest.mark.parametrize("change, message", [
    ({"factor": ABSENT}, "'rope_scaling.factor' is required for yarn"),
    ({"factor": 0}, "'rope_scaling.factor' must be > 0"),
    ({"original_max_position_embeddings": 0},
     "'rope_scaling.original_max_position_embeddings' must be >= 1"),
    ({"beta_fast": "32"}, "'rope_scaling.beta_fast' must be a finite number"),
    ({"beta_slow": -1.0}, "'rope_scaling.beta_slow' must be > 0"),
    ({"attention_factor": 0.0}, "'rope_scaling.attention_factor' must be > 0"),
    ({"mscale": -0.5}, "'rope_scaling.mscale' must be >= 0"),
    ({"mscale_all_dim": float("nan")}, "'rope_scaling.mscale_all_dim' must be a finite number"),
    ({"truncate": "yes"}, "'rope_scaling.truncate' must be true or false"),
    ({"truncate": None}, "'rope_scaling.truncate' must be true or false"),
], ids=["no-factor", "zero-factor", "zero-original", "string-beta", "negative-beta",
        "zero-attention-factor", "negative-mscale", "nan-mscale", "string-truncate",
        "null-truncate"])
def test_bad_yarn_fields_are_named(change, message):
    fields = {"factor": 4.0, "original_max_position_embeddings": 64} | change
    fields = {k: v for k, v in fields.items() if v is not ABSENT}
    with pytest.raises(ConfigError, match=message):
        config_from_dict(_yarn_config_json(fields, "rope_scaling"))


def test_phi3_yarn_is_refused():
    """transformers' Phi3Config turns a yarn dict into LongRoPE, which is not supported."""
    given = dict(COMMON, model_type="phi3", rope_scaling={"type": "yarn", "factor": 4.0})
    with pytest.raises(ConfigError, match="'rope_scaling.rope_type' is 'yarn'.*LongRoPE"):
        config_from_dict(given)
