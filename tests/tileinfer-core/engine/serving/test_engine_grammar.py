"""Structured outputs in the serving engine: requests with a JSON schema, mixed in the same
steps with unconstrained requests, give outputs that validate, and the unconstrained requests'
tokens equal ``generate`` of each alone, through chunked prefill, static steps and
pipelining (a pipelined step of structured rows runs its forward first and is sampled once the
tokens before it are committed)."""

from __future__ import annotations

import pytest
import torch

from grammar_helpers import SCHEMA, check_schema, smol_vocab_dir  # noqa: F401
from tileinfer import (LLMEngine, SamplingParams, compile_grammar, generate, load_model,
                       load_tokenizer)


@pytest.fixture(scope="module")
def smol(smollm2_dir, smol_vocab_dir):
    model = load_model(smol_vocab_dir, dtype=torch.float32, backend="ref", max_len=256)
    return model, load_tokenizer(smollm2_dir)


@pytest.mark.parametrize("kw", [dict(max_step_tokens=16, static_decode=False, pipeline=False),
                                dict(static_decode=True, pipeline=True)],
                         ids=["chunked", "static-pipelined"])
def test_mixed_structured_and_plain_requests(smol, kw):
    model, tok = smol
    grammar = compile_grammar(tok, json_schema=SCHEMA)
    reqs = []
    for i in range(6):
        structured = i % 2 == 0
        params = SamplingParams(1.0 if i % 3 else 0.0, top_k=50,
                                structure=grammar if structured else None)
        reqs.append(dict(prompt_ids=[1, 9 + i, 40, 7 + 3 * i] * (1 + i), sampling=params,
                         max_new_tokens=120 if structured else 25, seed=70 + i,
                         stop_ids=[2] if structured else []))
    engine = LLMEngine(model, num_pages=64, **kw)
    ids = [engine.add_request(**r) for r in reqs]
    tokens, reasons = {rid: [] for rid in ids}, {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_tokens)
            if out.finished:
                reasons[out.request_id] = out.finish_reason
        engine.check_accounting()
    for rid, r in zip(ids, reqs):
        if r["sampling"].structured:
            assert reasons[rid] == "stop"
            check_schema(tok.decode(tokens[rid]))
            alone = generate(model, r["prompt_ids"], r["max_new_tokens"], r["sampling"],
                             stop_ids=[2], seed=r["seed"])
            assert tokens[rid] == alone
        else:
            assert tokens[rid] == generate(model, r["prompt_ids"], 25, r["sampling"],
                                           stop_ids=[], seed=r["seed"])


def test_structured_requests_alone_are_pipelined(smol):
    model, tok = smol
    grammar = compile_grammar(tok, json_schema=SCHEMA)
    reqs = [dict(prompt_ids=[1, 5 + i, 33, 8] * (2 + i),
                 sampling=SamplingParams(1.0, top_k=40, structure=grammar),
                 max_new_tokens=120, seed=90 + i, stop_ids=[2]) for i in range(3)]
    engine = LLMEngine(model, num_pages=64, static_decode=True, pipeline=True)
    ids = [engine.add_request(**r) for r in reqs]
    tokens = {rid: [] for rid in ids}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
            tokens[out.request_id].extend(out.new_tokens)
        engine.check_accounting()
    assert engine.stats()["pipelined_steps"] > 0  # with only grammar rows running
    for rid, r in zip(ids, reqs):
        check_schema(tok.decode(tokens[rid]))
        assert tokens[rid] == generate(model, r["prompt_ids"], 120, r["sampling"], stop_ids=[2],
                                       seed=r["seed"])
