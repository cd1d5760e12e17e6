"""A random-weight tiny llama with the SmolLM2 vocabulary (49,152 ids, tied embeddings), so
that the real SmolLM2 tokenizer's grammars mask its logits, and the schemas the tests use."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from tiny_models import COMMON, redraw_weights, save_tiny

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "count": {"type": "integer", "minimum": 0, "maximum": 999},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]},
                                  "maxItems": 3},
                         "ok": {"type": "boolean"}},
          "required": ["name", "count", "tags", "ok"], "additionalProperties": False}


@pytest.fixture(scope="session")
def smol_vocab_dir(tmp_path_factory):
    """A 2-layer llama of hidden size 64 with SmolLM2's vocabulary size, seeded weights."""
    config = transformers.LlamaConfig(**dict(COMMON, vocab_size=49152, hidden_size=64,
                                             intermediate_size=128, head_dim=16,
                                             tie_word_embeddings=True))
    torch.manual_seed(5)
    model = transformers.LlamaForCausalLM(config).eval()
    redraw_weights(model, seed=5)
    model.generation_config.eos_token_id = None
    return save_tiny(model, tmp_path_factory.mktemp("smol-vocab") / "model")


def check_schema(text: str, schema=SCHEMA):
    """The parsed value of text, which must validate against schema (jsonschema when it is
    installed, else the checks this file's SCHEMA needs)."""
    value = json.loads(text)
    try:
        import jsonschema
    except ImportError:
        jsonschema = None
    if jsonschema is not None:
        jsonschema.validate(value, schema)
    else:
        assert set(value) == set(schema["required"])
        assert isinstance(value["name"], str) and len(value["name"]) <= 12
        assert isinstance(value["count"], int) and 0 <= value["count"] <= 999
        assert all(t in "abc" for t in value["tags"]) and len(value["tags"]) <= 3
        assert isinstance(value["ok"], bool)
    return value
