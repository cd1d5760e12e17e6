"""tokenizer_config.json and special_tokens_map.json: the named special tokens of a model folder.

Both files may write a token as a plain string or as a serialized ``AddedToken``
(``{"content": "<|eot_id|>", "lstrip": false, ...}``). tokenizer_config.json wins where both name
the same token, as in transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

# The named special tokens transformers passes to chat templates (``special_tokens_map``).
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


def read_json(path: Path) -> dict:
    """A JSON object from ``path``, or {} when the file is absent. A malformed file is a ValueError."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise ValueError(f"{path} should hold a JSON object, found {type(value).__name__}")
    return value


def read_tokenizer_config(model_dir: str | Path) -> dict:
    return read_json(Path(model_dir) / "tokenizer_config.json")


def token_content(value) -> str | None:
    """The text of a special token written as a string or as a serialized AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens(model_dir: str | Path) -> dict[str, str]:
    """``{"bos_token": "<|begin_of_text|>", "eos_token": ..., ...}`` for the tokens the folder names."""
    model_dir = Path(model_dir)
    merged = read_json(model_dir / "special_tokens_map.json")
    merged.update({k: v for k, v in read_tokenizer_config(model_dir).items() if v is not None})
    tokens = {}
    for name in SPECIAL_TOKEN_NAMES:
        content = token_content(merged.get(name))
        if content is not None:
            tokens[name] = content
    return tokens
