"""Number schemas compile with at most 6 fraction digits: the schema walk touches number schemas
at every schema position and nothing else; with the real SmolLM2 tokenizer the grammar refuses a
7th fraction digit and an exponent, and still takes what the original schema allows with up to 6
fraction digits."""

from __future__ import annotations

import json

import pytest

from tileinfer.backend.schema_numbers import FRACTION_DIGITS, bounded_numbers

STEP = 10.0 ** -FRACTION_DIGITS


def test_number_schemas_get_a_multiple_of_everywhere_and_data_is_untouched():
    schema = {"type": "object",
              "properties": {"a": {"type": "number"}, "b": {"type": ["number", "null"]},
                             "c": {"type": "integer"}, "d": {"type": "number", "multipleOf": 0.5},
                             "e": {"type": "array", "items": {"type": "number"}},
                             "f": {"anyOf": [{"type": "number"}, {"type": "string"}]},
                             "g": {"enum": [{"type": "number"}]},
                             "h": {"const": {"type": "number"}, "default": {"type": "number"}}},
              "$defs": {"n": {"type": "number", "minimum": 0}},
              "additionalProperties": {"type": "number"}}
    out = bounded_numbers(schema)
    p = out["properties"]
    assert p["a"]["multipleOf"] == STEP and p["b"]["multipleOf"] == STEP
    assert "multipleOf" not in p["c"] and p["d"]["multipleOf"] == 0.5
    assert p["e"]["items"]["multipleOf"] == STEP and p["f"]["anyOf"][0]["multipleOf"] == STEP
    assert "multipleOf" not in p["f"]["anyOf"][1]
    assert p["g"] == schema["properties"]["g"] and p["h"] == schema["properties"]["h"]
    assert out["$defs"]["n"] == {"type": "number", "minimum": 0, "multipleOf": STEP}
    assert out["additionalProperties"]["multipleOf"] == STEP
    assert "multipleOf" not in schema["properties"]["a"]  # the caller's schema is not changed
    assert bounded_numbers(True) is True


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    pytest.importorskip("llguidance")
    from tileinfer import load_tokenizer

    return load_tokenizer(smollm2_dir)


@pytest.mark.parametrize("text, allowed", [('{"x":202.000103}', True), ('{"x":5}', True),
                                           ('{"x":-3.25}', True), ('{"x":0.1234567}', False),
                                           ('{"x":2e5}', False)])
def test_the_grammar_takes_six_fraction_digits_at_most(tokenizer, text, allowed):
    from tileinfer import compile_grammar

    schema = {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}
    matcher = compile_grammar(tokenizer, json_schema=schema).matcher()
    ids = tokenizer.encode(text, add_special_tokens=False)
    taken = all(matcher.advance(i) for i in ids) and matcher.accepting
    assert taken == allowed, text
    assert isinstance(json.loads(text)["x"], (int, float))  # valid for the original schema
