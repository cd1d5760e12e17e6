"""A JSON answer after a thinking model's thinking (``compile_grammar(..., think=...)``): with
SmolLM2's tokenizer given ``<think>`` and ``</think>`` as special tokens, as Qwen3's has them,
the matcher takes free text inside the block and then only compact JSON of the schema; "open"
(the prompt opened the block) starts inside it; the refusals name what is wrong. And the server
asks for it when it splits reasoning and the tags are tokens."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("llguidance")

from tileinfer import GrammarError, compile_grammar, load_tokenizer  # noqa: E402

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def thinking_dir(smollm2_dir, tmp_path_factory):
    """SmolLM2's tokenizer files, with <think> and </think> added as special tokens."""
    from tokenizers import AddedToken, Tokenizer

    folder = tmp_path_factory.mktemp("thinking-tokenizer")
    for path in smollm2_dir.iterdir():
        if path.suffix in (".json", ".jinja", ".txt"):
            shutil.copy(path, folder / path.name)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<think>", "</think>")])
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def tok(thinking_dir):
    return load_tokenizer(thinking_dir)


def takes(grammar, tok, pieces) -> str:
    """"accepting" / "open" (taken, not complete) / "rejected" for a token sequence made of
    text pieces and the tags (as their special ids)."""
    matcher = grammar.matcher()
    for piece in pieces:
        ids = [tok.token_to_id(piece)] if piece in ("<think>", "</think>") else \
            tok.encode(piece, add_special_tokens=False)
        for i in ids:
            if not matcher.advance(i):
                return "rejected"
    return "accepting" if matcher.accepting else "open"


def test_a_json_answer_may_think_first(tok):
    g = compile_grammar(tok, json_schema=SCHEMA, think="optional")
    assert g.think == "optional"
    think = ["<think>", '\nHmm, {"a": 2} or "a": 3?\n', "</think>", "\n\n"]
    assert takes(g, tok, think + ['{"a":1}']) == "accepting"
    assert takes(g, tok, ['{"a":1}']) == "accepting"  # without thinking
    assert takes(g, tok, think) == "open"  # the answer must still come (no end allowed yet)
    assert takes(g, tok, think + ["Hello"]) == "rejected"
    assert takes(g, tok, think + ['{"a": 1}']) == "rejected"  # compact, as every JSON answer
    assert takes(g, tok, ["Hello"]) == "rejected"
    g = compile_grammar(tok, json_object=True, think="optional")
    assert takes(g, tok, think + ['{"b":[1]}']) == "accepting"


def test_an_open_block_is_closed_before_the_json(tok):
    g = compile_grammar(tok, json_schema=SCHEMA, think="open")
    assert takes(g, tok, ["Hmm.\n", "</think>", "\n\n", '{"a":7}']) == "accepting"
    assert takes(g, tok, ['{"a":7}']) == "open"  # still thinking: it has not closed the block


def test_think_is_refused_where_it_cannot_apply(tok, smollm2_dir):
    with pytest.raises(GrammarError, match="json_object and json_schema"):
        compile_grammar(tok, regex="[a-z]+", think="optional")
    with pytest.raises(GrammarError, match='"optional" or "open"'):
        compile_grammar(tok, json_schema=SCHEMA, think="always")
    with pytest.raises(GrammarError, match="<think> and </think> tokens"):
        compile_grammar(load_tokenizer(smollm2_dir), json_schema=SCHEMA, think="optional")
    assert compile_grammar(tok, json_schema=SCHEMA).think is None


@pytest.mark.parametrize("template, mode", [
    ("{% for m in messages %}{{ m.content }}{% endfor %}<think></think>"
     "{% if add_generation_prompt %}A:{% endif %}", "optional"),
    ("{% for m in messages %}{{ m.content }}{% endfor %}</think>"
     "{% if add_generation_prompt %}A:<think>\n{% endif %}", "open"),
])
def test_the_server_asks_for_it_when_it_splits_reasoning(thinking_dir, tok, tmp_path, template,
                                                         mode):
    pytest.importorskip("pydantic")
    from types import SimpleNamespace

    from tileinfer_cli.serve.defaults import SamplingDefaults
    from tileinfer_cli.serve.prepare import plan_chat
    from tileinfer_cli.serve.schemas import ChatRequest
    from tileinfer_cli.serve.template import ServedTemplate

    (thinking_dir / "chat_template.jinja").write_text(template)
    served = SimpleNamespace(defaults=SamplingDefaults.of_folder(tmp_path), vocab_size=49154,
                             max_len=256, stop_ids=[2], tokenizer=tok, tool_parser=None,
                             template=ServedTemplate(thinking_dir), reasoning=True)
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    req = ChatRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                      response_format=fmt)
    assert plan_chat(served, req).sampling.structure.think == mode
    regex = ChatRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                        guided_regex="[a-z]+")
    assert plan_chat(served, regex).sampling.structure.think is None
    served.reasoning = False
    assert plan_chat(served, req).sampling.structure.think is None
