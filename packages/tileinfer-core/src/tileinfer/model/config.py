"""ModelConfig: the hyperparameters of a Llama-style decoder, read from a model's config.json.

Supported ``model_type``s: ``llama``, ``mistral``, ``qwen2`` (Qwen2 and Qwen2.5), ``qwen3``,
``apertus``, ``smollm3``, ``granite`` (IBM Granite 3), ``phi3`` (Phi-3 and Phi-4 without
LongRoPE or partial RoPE), ``gemma3_text`` and ``gemma3``'s text model (``gemma.py``). Both
config.json forms are read:

- transformers 4: ``rope_theta`` at the top level and ``rope_scaling`` (a dict or null);
- transformers 5: ``rope_parameters`` (``{"rope_type", "rope_theta", "factor", ...}``).

As in transformers, a non-null ``rope_scaling`` wins over ``rope_parameters``, and a ``rope_theta``
inside the RoPE dict wins over the top-level one (``rope_config.py`` reads the RoPE dict: plain,
``linear``, ``llama3`` or ``yarn``). Fields that transformers fills with a default
when config.json omits them get the same default here (per architecture, see ``_DEFAULTS``);
the fields without a sensible default (the sizes) are required, and a missing one is a
``ConfigError`` naming it.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .config_fields import ConfigError, float_field, int_field
from .gemma import GemmaConfig, gemma_config, text_config_of
from .rope_config import rope_from, with_rope

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "apertus", "smollm3", "granite",
                         "phi3", "gemma3_text")

# config.json fields every model must state (no default would be meaningful).
REQUIRED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                   "num_attention_heads")

# transformers' defaults (5.17) for the optional fields, per architecture. ``None`` for
# num_key_value_heads means "same as num_attention_heads"; for head_dim "hidden / heads".
_DEFAULTS = {
    "llama": dict(num_key_value_heads=None, head_dim=None, rms_norm_eps=1e-6, rope_theta=10000.0,
                  max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                  hidden_act="silu"),
    "mistral": dict(num_key_value_heads=8, head_dim=None, rms_norm_eps=1e-6, rope_theta=10000.0,
                    max_position_embeddings=4096 * 32, bos_token_id=1, eos_token_id=2,
                    hidden_act="silu", sliding_window=4096),
    "qwen2": dict(num_key_value_heads=32, head_dim=None, rms_norm_eps=1e-6, rope_theta=10000.0,
                  max_position_embeddings=32768, bos_token_id=None, eos_token_id=None,
                  hidden_act="silu"),
    "qwen3": dict(num_key_value_heads=32, head_dim=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                  max_position_embeddings=32768, bos_token_id=None, eos_token_id=None,
                  hidden_act="silu"),
    "apertus": dict(num_key_value_heads=None, head_dim=None, rms_norm_eps=1e-5,
                    rope_theta=12000000.0, max_position_embeddings=65536, bos_token_id=1,
                    eos_token_id=2, hidden_act="xielu"),
    "smollm3": dict(num_key_value_heads=4, head_dim=None, rms_norm_eps=1e-6, rope_theta=2000000.0,
                    max_position_embeddings=32768, bos_token_id=128000, eos_token_id=128001,
                    hidden_act="silu", tie_word_embeddings=True),
    "granite": dict(num_key_value_heads=None, head_dim=None, rms_norm_eps=1e-6, rope_theta=10000.0,
                    max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                    hidden_act="silu"),
    "phi3": dict(num_key_value_heads=None, head_dim=None, rms_norm_eps=1e-5, rope_theta=10000.0,
                 max_position_embeddings=4096, bos_token_id=1, eos_token_id=32000,
                 hidden_act="silu", sliding_window=None),
    "gemma3_text": dict(num_key_value_heads=4, head_dim=256, rms_norm_eps=1e-6,
                        rope_theta=1000000.0, max_position_embeddings=131072, bos_token_id=2,
                        eos_token_id=1, hidden_act="gelu_pytorch_tanh", sliding_window=4096,
                        tie_word_embeddings=True),
}

# Whose sliding_window is every layer's (attention_window runs it); in Qwen2, Qwen3 and SmolLM3
# (use_sliding_window) max_len stops at it.
WINDOWED_TYPES = ("mistral", "phi3")

# Fields whose explicit null means "none" rather than "the default".
_NULLABLE = ("bos_token_id", "eos_token_id", "sliding_window")


@dataclass(frozen=True)
class Multipliers:
    """Granite's scalings: the embeddings times ``embedding``, each layer's attention and MLP
    outputs times ``residual`` before they join the residual stream, attention scores times
    ``attention`` (instead of head_dim ** -0.5), the logits divided by ``logits``."""

    embedding: float
    residual: float
    attention: float
    logits: float


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of a Llama-style decoder.

    rope_scaling: None for plain RoPE, else a normalized dict (``rope_config.py`` lists its keys):
    ``linear`` (``rope_type``, ``factor``), ``llama3`` (also ``low_freq_factor``,
    ``high_freq_factor``, ``original_max_position_embeddings``) or ``yarn`` (``factor``,
    ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``, ``truncate``,
    ``attention_factor``, ``mscale``, ``mscale_all_dim``; the last three may be None). qk_norm:
    per-head RMSNorm of queries and keys before RoPE (Qwen3, Apertus). qkv_bias: biases added to
    the q, k and v projections (Qwen2). mlp: ``"swiglu"`` (gated, gate/up/down) or ``"xielu"``
    (Apertus: ungated up/down with the xIELU activation; ``"geglu"``: Gemma's gate/up/down with
    gelu (tanh) on the gate). sliding_window: the attention window of Mistral or Phi-3 (or of a
    Qwen2, Qwen3 or SmolLM3 with use_sliding_window), None when attention is global.
    rope_layers: per layer, whether its queries and keys are rotated (SmolLM3 leaves every
    fourth layer without RoPE); None: all are. multipliers: Granite's scalings
    (``Multipliers``), None for the others. gemma: Gemma 3's differences
    (``gemma.GemmaConfig``), None for the others.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None = field(hash=False)
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool
    qkv_bias: bool
    mlp: str
    rope_layers: tuple[bool, ...] | None
    multipliers: Multipliers | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None
    gemma: GemmaConfig | None = None

    @property
    def layer_windows(self) -> tuple[int | None, ...] | None:
        """Per layer, its attention's sliding window (None: full), or None when no layer has
        one: Gemma 3's local layers; every layer of a Mistral or Phi-3 with a sliding_window."""
        if self.gemma is not None:
            return self.gemma.layer_windows
        if self.sliding_window is not None and self.model_type in WINDOWED_TYPES:
            return (self.sliding_window,) * self.num_layers
        return None

    @property
    def gated(self) -> bool:
        """Whether the MLP has a gate (its up weight stacks gate rows over up rows)."""
        return self.mlp in ("swiglu", "geglu")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qkv_size(self) -> int:
        """Rows of the fused q/k/v weight: q heads, then k heads, then v heads."""
        return self.q_size + 2 * self.kv_size

    @property
    def attention_scale(self) -> float:
        if self.multipliers is not None:
            return self.multipliers.attention
        if self.gemma is not None:
            return self.gemma.query_pre_attn_scalar ** -0.5
        return self.head_dim ** -0.5


def config_from_dict(d: dict) -> ModelConfig:
    """A ModelConfig from the parsed config.json ``d`` (either transformers form)."""
    if not isinstance(d, dict):
        raise ConfigError(f"config.json must hold a JSON object, got {type(d).__name__}")
    d = text_config_of(d)  # a multimodal Gemma 3's: its text model's
    model_type = d.get("model_type")
    if model_type is None:
        raise ConfigError("config field 'model_type' is missing")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"config field 'model_type' is {model_type!r}, which is not supported "
                          f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    for name in REQUIRED_FIELDS:
        if d.get(name) is None:
            raise ConfigError(f"config field {name!r} is missing (model_type {model_type!r})")
    defaults = _DEFAULTS[model_type]

    def get(name):
        # Absent (or null) fields take transformers' default; a null token id or window stays
        # null, as in transformers.
        value = d.get(name)
        if value is None and not (name in d and name in _NULLABLE):
            return defaults.get(name)
        return value

    # Qwen2's q/k/v projections always have biases, and transformers' Qwen2 reads neither field.
    for name in ("attention_bias", "mlp_bias"):
        if d.get(name) and model_type != "qwen2":
            raise ConfigError(f"config field {name!r} is true: linear layers with biases are "
                              "not supported")
    act = get("hidden_act")
    if model_type == "gemma3_text":
        act = d.get("hidden_activation") or act
    expected_act = {"apertus": "xielu", "gemma3_text": "gelu_pytorch_tanh"}.get(model_type,
                                                                                "silu")
    if act != expected_act:
        raise ConfigError(f"config field 'hidden_act' is {act!r}; {model_type} models are "
                          f"supported with {expected_act!r} only")

    hidden = int_field(d, "hidden_size")
    heads = int_field(d, "num_attention_heads")
    kv_heads = int_field(d, "num_key_value_heads", get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise ConfigError(f"config field 'num_attention_heads' ({heads}) must be a multiple of "
                          f"'num_key_value_heads' ({kv_heads})")
    head_dim = get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise ConfigError("config field 'head_dim' is missing and hidden_size is not a "
                              "multiple of num_attention_heads")
        head_dim = hidden // heads
    head_dim = int_field(d, "head_dim", head_dim)
    if head_dim % 2:
        raise ConfigError(f"config field 'head_dim' must be even for RoPE, got {head_dim}")
    max_pos = int_field(d, "max_position_embeddings", get("max_position_embeddings"))
    gemma = None
    if model_type == "gemma3_text":
        gemma, rope_theta, rope_scaling = gemma_config(d, int_field(d, "num_hidden_layers"),
                                                        get("sliding_window"))
    else:
        rope_theta, rope_scaling = rope_from(d, model_type, max_pos,
                                             defaults["rope_theta"])

    eos = get("eos_token_id")
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    eos_ids = tuple(int_field({}, "eos_token_id", e, minimum=0) for e in eos_ids)
    bos = get("bos_token_id")
    bos = None if bos is None else int_field({}, "bos_token_id", bos, minimum=0)

    sliding_window = None
    if model_type in ("mistral", "phi3"):
        sliding_window = get("sliding_window")
    elif model_type in ("qwen2", "qwen3") and d.get("use_sliding_window"):
        sliding_window = d.get("sliding_window", 4096)
    elif model_type == "smollm3" and d.get("use_sliding_window"):
        sliding_window = d.get("sliding_window")
    if sliding_window is not None:
        sliding_window = int_field(d, "sliding_window", sliding_window)

    num_layers = int_field(d, "num_hidden_layers")
    return ModelConfig(
        model_type=model_type,
        vocab_size=int_field(d, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=int_field(d, "intermediate_size"),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float_field("rms_norm_eps", get("rms_norm_eps")),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=max_pos,
        tie_word_embeddings=bool(get("tie_word_embeddings")),
        qk_norm=model_type in ("qwen3", "apertus", "gemma3_text"),
        qkv_bias=model_type == "qwen2",
        mlp={"apertus": "xielu", "gemma3_text": "geglu"}.get(model_type, "swiglu"),
        rope_layers=_rope_layers(d, num_layers) if model_type == "smollm3" else None,
        multipliers=_multipliers(d) if model_type == "granite" else None,
        bos_token_id=bos,
        eos_token_ids=eos_ids,
        sliding_window=sliding_window,
        gemma=gemma,
    )


def _rope_layers(d: dict, num_layers: int) -> tuple[bool, ...]:
    """SmolLM3's ``no_rope_layers`` (per layer 1: RoPE, 0: none), or as transformers makes it
    from ``no_rope_layer_interval`` (default 4: every fourth layer without RoPE)."""
    flags = d.get("no_rope_layers")
    if flags is None:
        interval = int_field(d, "no_rope_layer_interval", d.get("no_rope_layer_interval", 4))
        return tuple((i + 1) % interval != 0 for i in range(num_layers))
    if (not isinstance(flags, list) or len(flags) != num_layers
            or any(f not in (0, 1) for f in flags)):
        raise ConfigError(f"config field 'no_rope_layers' must list 0 or 1 for each of the "
                          f"{num_layers} layers, got {flags!r}")
    return tuple(bool(f) for f in flags)


def _multipliers(d: dict) -> Multipliers:
    """Granite's four scalings (transformers' default for each: 1)."""
    names = {"embedding": "embedding_multiplier", "residual": "residual_multiplier",
             "attention": "attention_multiplier", "logits": "logits_scaling"}
    return Multipliers(**{key: float_field(name, d.get(name, 1.0)) for key, name in names.items()})


def load_config(model_dir, rope_scaling: dict | None = None) -> ModelConfig:
    """Read ``config.json`` from a model directory. rope_scaling: a RoPE dict that replaces the
    file's (``rope_config.with_rope``)."""
    path = Path(model_dir) / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no config.json in {model_dir}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    return config_from_dict(d if rope_scaling is None else with_rope(d, rope_scaling))


def model_positions(config: ModelConfig) -> tuple[int, str]:
    """The positions a model is made for, and where the number comes from: its
    max_position_embeddings, or with YaRN factor x its original context where that is more (as
    vLLM reads a YaRN model's length)."""
    scaling = config.rope_scaling
    if scaling is not None and scaling["rope_type"] == "yarn":
        stretched = int(scaling["factor"] * scaling["original_max_position_embeddings"])
        if stretched > config.max_position_embeddings:
            return stretched, "YaRN's factor x original_max_position_embeddings"
    return config.max_position_embeddings, "config field 'max_position_embeddings'"


class LongContextWarning(UserWarning):
    """A max_len beyond the model's positions, accepted with allow_long=True."""


# The longest sequence a model is loaded for when the caller does not say.
DEFAULT_MAX_LEN = 4096


def default_max_len(config: ModelConfig) -> int:
    """DEFAULT_MAX_LEN, or fewer: the model's positions, or its attention window (within the
    window plain causal attention sees the same positions, and runs on every backend's own
    kernels; a longer max_len runs the ``attention_window`` op, or is refused: see
    ``check_max_len``)."""
    return min(DEFAULT_MAX_LEN, model_positions(config)[0],
               config.sliding_window or DEFAULT_MAX_LEN)


def check_max_len(config: ModelConfig, max_len: int, allow_long: bool = False):
    """Refuse settings this engine would run wrongly.

    A max_len beyond the model's positions (``model_positions``: ``max_position_embeddings``,
    or YaRN's stretch) is refused: the model was not made for those positions and its output
    there is not to be trusted. ``allow_long=True`` accepts it with a ``LongContextWarning``.

    A query at position p of a sliding-window layer attends to the positions ``p - window + 1
    .. p``: below max_len <= window that is all of them, and plain causal attention is exact.
    Beyond it the window runs on the ``attention_window`` op for Mistral, Phi-3 and Gemma 3
    (``layer_windows``); the windows of Qwen2's, Qwen3's and SmolLM3's use_sliding_window
    layers are not implemented, so a longer max_len is refused for them.
    """
    positions, source = model_positions(config)
    if max_len > positions:
        if not allow_long:
            raise ConfigError(
                f"max_len {max_len} exceeds the model's {positions} positions ({source}); use "
                f"max_len <= {positions}, or insist with allow_long=True (tileinfer: "
                "--allow-long-context)")
        warnings.warn(f"max_len {max_len} exceeds the model's {positions} positions ({source}): "
                      f"output past position {positions} may be poor", LongContextWarning,
                      stacklevel=3)
    if config.sliding_window is not None and config.sliding_window < max_len \
            and config.layer_windows is None:
        raise ConfigError(
            f"config field 'sliding_window' is {config.sliding_window}, smaller than max_len "
            f"{max_len}: the sliding window of {config.model_type}'s use_sliding_window "
            f"layers is not implemented; load the model with max_len <= "
            f"{config.sliding_window}")
