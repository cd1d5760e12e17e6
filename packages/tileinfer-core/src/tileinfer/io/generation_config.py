"""The model authors' generation settings: generation_config.json, read as transformers reads it.

transformers samples only when ``do_sample`` is true (its default is false: greedy), and then fills
unset values with its own defaults: temperature 1.0, top_k 50, top_p 1.0, and applies ``min_p``
where set. ``repetition_penalty`` applies whether it samples or not (Qwen2.5's Instruct models set
1.05-1.1). ``eos_token_id`` (an int or a list) says which tokens end a reply; without it,
config.json's eos_token_id does.

``sampling_settings`` reads the sampling values the file sets, whatever its ``do_sample``: what an
OpenAI-compatible server takes for the parameters a request leaves out (as vLLM does).
"""

from __future__ import annotations

from pathlib import Path

from ..backend.sampling import SamplingParams
from .tokenizer_config import read_json

# transformers' GenerationConfig defaults for the values a sampling model leaves unset.
HF_DEFAULT_TEMPERATURE = 1.0
HF_DEFAULT_TOP_K = 50
HF_DEFAULT_TOP_P = 1.0


def _token_ids(value, source: str) -> list[int]:
    if value is None:
        return []
    values = value if isinstance(value, (list, tuple)) else [value]
    ids = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{source}: eos_token_id should be a token id or a list of them, got {value!r}")
        if v not in ids:
            ids.append(v)
    return ids


def _config_eos(model_dir: Path, config) -> list[int]:
    if config is not None:
        ids = getattr(config, "eos_token_ids", None)
        if ids is None:
            ids = getattr(config, "eos_token_id", None)
        if ids is None and isinstance(config, dict):
            ids = config.get("eos_token_id")
        return _token_ids(ids, "config")
    return _token_ids(read_json(model_dir / "config.json").get("eos_token_id"), str(model_dir / "config.json"))


def generation_defaults(model_dir: str | Path, config=None) -> tuple[SamplingParams, list[int]]:
    """``(sampling, stop_ids)`` the model's authors recommend: from generation_config.json when the
    folder has one; greedy and the config's EOS otherwise. ``config`` (a ModelConfig or config.json's
    dict) saves reading config.json again."""
    model_dir = Path(model_dir)
    path = model_dir / "generation_config.json"
    settings = read_json(path)
    stop_ids = _token_ids(settings.get("eos_token_id"), str(path))
    if not stop_ids:
        stop_ids = _config_eos(model_dir, config)

    def value(name, default):
        v = settings.get(name)
        return default if v is None else v

    try:
        penalty = float(value("repetition_penalty", 1.0))
        if not settings.get("do_sample"):
            return SamplingParams(repetition_penalty=penalty), stop_ids
        sampling = SamplingParams(
            temperature=float(value("temperature", HF_DEFAULT_TEMPERATURE)),
            top_k=int(value("top_k", HF_DEFAULT_TOP_K)),
            top_p=float(value("top_p", HF_DEFAULT_TOP_P)),
            min_p=float(value("min_p", 0.0)),
            repetition_penalty=penalty,
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: unusable sampling settings: {e}") from e
    return sampling, stop_ids


SAMPLING_SETTINGS = (("temperature", float), ("top_p", float), ("top_k", int), ("min_p", float),
                     ("repetition_penalty", float))


def sampling_settings(model_dir: str | Path) -> dict:
    """``{"temperature": 0.6, "top_p": 0.95, "top_k": 20}``: those of SAMPLING_SETTINGS that the
    folder's generation_config.json sets (not null), whatever its do_sample; {} without the file.
    A value that is not a number is a ValueError naming the file."""
    path = Path(model_dir) / "generation_config.json"
    settings = read_json(path)
    found = {}
    for name, kind in SAMPLING_SETTINGS:
        value = settings.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or (kind is int and value != int(value)):
            raise ValueError(f"{path}: {name} should be a{'n integer' if kind is int else ' number'}, "
                             f"got {value!r}")
        found[name] = kind(value)
    return found
