"""The RoPE dict of a config.json, checked and normalized as transformers (5.17) reads it.

config.json states RoPE in transformers 4's ``rope_scaling`` or in transformers 5's
``rope_parameters``; a non-null ``rope_scaling`` wins, and a ``rope_theta`` inside the dict
wins over the top-level one. ``rope_from`` returns the theta and the normalized dict that
``ModelConfig.rope_scaling`` holds and ``rope.py`` turns into tables (None: plain RoPE):

- ``linear``: ``rope_type``, ``factor``;
- ``llama3``: ``rope_type``, ``factor``, ``low_freq_factor``, ``high_freq_factor``,
  ``original_max_position_embeddings``;
- ``yarn``: ``rope_type``, ``factor``, ``original_max_position_embeddings``, ``beta_fast``,
  ``beta_slow``, ``truncate``, and ``attention_factor``, ``mscale``, ``mscale_all_dim``, each
  None where config.json has none.

transformers' defaults fill the gaps: an absent original_max_position_embeddings is
max_position_embeddings; for yarn a null factor is max_position_embeddings / original,
beta_fast 32, beta_slow 1, truncate true. A missing or bad field is one ``ConfigError`` that
names it.

``with_rope`` puts a RoPE dict given at load time (``load_model(rope_scaling=...)``, the CLI's
``--rope-scaling``) in place of the file's.
"""

from __future__ import annotations

from .config_fields import ConfigError, float_field, int_field

SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear", "yarn")

_LLAMA3_FIELDS = ("factor", "low_freq_factor", "high_freq_factor")

# Apertus' RoPE when config.json has neither rope_scaling nor rope_parameters (transformers'
# ApertusConfig default).
_APERTUS_DEFAULT_ROPE = {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0,
                         "original_max_position_embeddings": 8192, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0}


def _stated_rope(d: dict, model_type: str | None):
    """(the RoPE dict config.json states, or None; the field it is in): a non-null rope_scaling
    wins over rope_parameters. As transformers, Apertus without one gets its default dict (whose
    rope_theta then wins over a top-level rope_theta)."""
    rope = d.get("rope_scaling") or d.get("rope_parameters")
    source = "rope_scaling" if d.get("rope_scaling") else "rope_parameters"
    if rope is None and model_type == "apertus":
        rope, source = dict(_APERTUS_DEFAULT_ROPE), "rope_parameters"
    return rope, source


def rope_from(d: dict, model_type: str, max_position_embeddings: int, default_theta: float):
    """(rope_theta, normalized rope_scaling or None) from either config.json form."""
    rope, source = _stated_rope(d, model_type)
    rope = dict(rope or {})
    if rope and not isinstance(rope.get("rope_type", rope.get("type", "default")), str):
        # transformers 5 may nest one dict per layer type (e.g. Gemma): not these architectures.
        raise ConfigError(f"config field {source!r} must be one dict with 'rope_type', got {rope}")
    theta = float_field("rope_theta", rope.get("rope_theta", d.get("rope_theta", default_theta)))
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(f"config field '{source}.rope_type' is {rope_type!r}, which is not "
                          f"supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    partial = rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if partial not in (None, 1, 1.0):
        raise ConfigError(f"config field 'partial_rotary_factor' is {partial}; only 1.0 "
                          "(RoPE over the whole head) is supported")
    if rope_type == "default":
        return theta, None
    if rope_type == "linear":  # positions divided by factor
        return theta, {"rope_type": "linear", "factor": float_field(f"{source}.factor",
                                                               rope.get("factor"))}
    # transformers falls back to max_position_embeddings when the original length is absent.
    original = int_field({}, f"{source}.original_max_position_embeddings",
                         rope.get("original_max_position_embeddings", max_position_embeddings))
    if rope_type == "yarn":
        return theta, _yarn(rope, source, model_type, max_position_embeddings, original)
    scaling = {"rope_type": "llama3"}
    for name in _LLAMA3_FIELDS:
        if rope.get(name) is None:
            raise ConfigError(f"config field '{source}.{name}' is required for llama3 RoPE scaling")
        scaling[name] = float_field(f"{source}.{name}", rope[name])
    if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise ConfigError(f"config field '{source}.high_freq_factor' must exceed low_freq_factor")
    scaling["original_max_position_embeddings"] = original
    return theta, scaling


def _yarn(rope: dict, source: str, model_type: str, max_position_embeddings: int,
          original: int) -> dict:
    """The normalized yarn dict (see the module docstring)."""
    if model_type == "phi3":
        raise ConfigError(f"config field '{source}.rope_type' is 'yarn': transformers runs a "
                          "Phi-3's yarn as LongRoPE, which is not supported")
    if "factor" not in rope:  # transformers requires the key; a null factor it derives
        raise ConfigError(f"config field '{source}.factor' is required for yarn RoPE scaling")
    factor = rope["factor"]
    if factor is None:
        factor = max_position_embeddings / original
    truncate = rope.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ConfigError(f"config field '{source}.truncate' must be true or false, got "
                          f"{truncate!r}")

    def number(name, default=None, positive=True):
        value = rope.get(name)
        if value is None:
            return default
        value = float_field(f"{source}.{name}", value, positive=positive)
        if value < 0:
            raise ConfigError(f"config field '{source}.{name}' must be >= 0, got {value}")
        return value

    return {"rope_type": "yarn", "factor": float_field(f"{source}.factor", factor),
            "original_max_position_embeddings": original,
            "beta_fast": number("beta_fast", 32.0), "beta_slow": number("beta_slow", 1.0),
            "truncate": truncate, "attention_factor": number("attention_factor"),
            # transformers reads an mscale of 0 as none: allowed here too.
            "mscale": number("mscale", positive=False),
            "mscale_all_dim": number("mscale_all_dim", positive=False)}


def with_rope(d: dict, rope: dict) -> dict:
    """config.json's dict d with its RoPE dict replaced by rope, a dict as config.json states
    one (``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}``
    turns YaRN on, ``{"rope_type": "default"}`` any scaling off): the model's rope_theta is kept
    unless rope states one. Gemma 3, with one RoPE per layer type, is refused."""
    if not isinstance(rope, dict):
        raise ConfigError(f"a RoPE override must be a JSON object, got {rope!r}")
    if d.get("model_type") in ("gemma3", "gemma3_text"):
        raise ConfigError("a RoPE override is not supported for Gemma 3 (one RoPE per layer "
                          "type)")
    current = _stated_rope(d, d.get("model_type"))[0]
    current = current if isinstance(current, dict) else {}  # a bad one: rope_from's error
    theta = rope.get("rope_theta", current.get("rope_theta", d.get("rope_theta")))
    out = {k: v for k, v in d.items() if k != "rope_parameters"}
    out["rope_scaling"] = dict(rope) if theta is None else {**rope, "rope_theta": theta}
    return out
