"""Structured outputs in ``generate``: with a random-weight model and the real SmolLM2
tokenizer, every output follows its grammar (a JSON schema, any JSON object, a regex, a Lark
grammar), greedy or sampled; a generation without a grammar is unchanged; speculative decoding
and a bad grammar are refused with one clear error."""

from __future__ import annotations

import json
import re

import pytest
import torch

from grammar_helpers import SCHEMA, check_schema, smol_vocab_dir  # noqa: F401
from tileinfer import (GrammarError, NgramProposer, SamplingParams, compile_grammar, generate,
                       load_model, load_tokenizer)


@pytest.fixture(scope="module")
def smol(smollm2_dir, smol_vocab_dir):
    model = load_model(smol_vocab_dir, dtype=torch.float32, backend="ref", max_len=256)
    return model, load_tokenizer(smollm2_dir)


def run(model, grammar, temperature, seed, n=120):
    return generate(model, [1, 9, 40, 7], n, SamplingParams(temperature, structure=grammar),
                    stop_ids=[2], seed=seed)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_outputs_validate(smol, temperature):
    model, tok = smol
    grammar = compile_grammar(tok, json_schema=SCHEMA)
    for seed in range(3):
        check_schema(tok.decode(run(model, grammar, temperature, seed)))


def test_json_object_regex_and_lark(smol):
    model, tok = smol
    out = tok.decode(run(model, compile_grammar(tok, json_object=True), 1.0, 4, n=200))
    assert isinstance(json.loads(out), dict)
    pattern = r"[0-9]{3}-[a-z]{2,5}"
    out = tok.decode(run(model, compile_grammar(tok, regex=pattern), 1.0, 5))
    assert re.fullmatch(pattern, out), out
    out = tok.decode(run(model, compile_grammar(tok, lark='start: ("yes" | "no") "!"'), 1.0, 6))
    assert out in ("yes!", "no!")


def test_grammars_compile_once(smol):
    _, tok = smol
    assert compile_grammar(tok, json_schema=SCHEMA) is compile_grammar(
        tok, json_schema=json.dumps(SCHEMA))


def test_a_schema_asked_by_many_threads_at_once_compiles_once(smol, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    from tileinfer.backend import grammar as grammar_module

    model, tok = smol
    calls = []
    real = grammar_module._compile

    def counted(*args):
        calls.append(args[0])
        return real(*args)

    monkeypatch.setattr(grammar_module, "_compile", counted)
    schema = {"type": "object", "properties": {"threads": {"type": "integer"}},
              "required": ["threads"], "additionalProperties": False}
    with ThreadPoolExecutor(8) as pool:
        grammars = list(pool.map(lambda _: compile_grammar(tok, json_schema=schema), range(16)))
    assert len(calls) == 1 and all(g is grammars[0] for g in grammars)


def test_unconstrained_generation_is_unchanged(smol):
    model, tok = smol
    plain = generate(model, [1, 9, 40, 7], 20, SamplingParams(1.0), stop_ids=[], seed=3)
    run(model, compile_grammar(tok, json_object=True), 1.0, 3)
    assert generate(model, [1, 9, 40, 7], 20, SamplingParams(1.0), stop_ids=[], seed=3) == plain


@pytest.mark.parametrize("bad", [dict(json_schema="{not json"), dict(json_schema={"type": "x"}),
                                 dict(regex="(a"), dict(lark="start: missing"), dict(),
                                 dict(regex="a", json_object=True)])
def test_bad_grammar_is_one_clear_error(smol, bad):
    with pytest.raises(GrammarError):
        compile_grammar(smol[1], **bad)


def test_structure_must_be_a_grammar():
    with pytest.raises(ValueError, match="structure must be a Grammar"):
        SamplingParams(structure={"type": "object"})


def test_speculative_refuses_a_grammar(smol):
    model, tok = smol
    with pytest.raises(ValueError, match="speculative decoding does not take a grammar"):
        generate(model, [1, 2, 3], 5, SamplingParams(structure=compile_grammar(
            tok, json_object=True)), speculative=NgramProposer())
