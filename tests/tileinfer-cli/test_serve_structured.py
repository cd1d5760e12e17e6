"""Structured outputs through ``tileinfer serve`` (the tiny random-weight model with SmolLM2's
tokenizer, driven by the official ``openai`` client): response_format json_schema and
json_object, guided_regex on completions, vLLM's structured_outputs and guided_choice; answers
parse and validate; bad schemas and conflicting requests are a 400 naming the parameter."""

from __future__ import annotations

import json
import re

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client", "llguidance"):
    pytest.importorskip(_module)
openai = pytest.importorskip("openai")

from grammar_helpers import SCHEMA, check_schema
from test_serve_helpers import ServerProcess, tiny_folder

TIMEOUT = 120


@pytest.fixture(scope="module")
def client(smollm2_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-structured")
    folder = tiny_folder(smollm2_dir, root)
    s = ServerProcess(["-m", folder, "--load-format", "dummy", "--kv-tokens", "4096",
                       "--max-running", "4"], root / "server.log")
    try:
        s.wait_ready()
        yield openai.OpenAI(base_url=s.url + "/v1", api_key="none", timeout=TIMEOUT,
                            max_retries=0)
    finally:
        rc = s.stop()
    assert rc == 0, s.output()


def chat(client, **kw):
    return client.chat.completions.create(
        model="tiny-smollm2-shape", messages=[{"role": "user", "content": "Describe a cat as JSON."}],
        **{"max_tokens": 150, **kw})


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_answers_validate(client, temperature):
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": SCHEMA,
                                                  "strict": True}}
    for seed in range(2):
        r = chat(client, response_format=fmt, temperature=temperature, seed=seed)
        assert r.choices[0].finish_reason == "stop"
        check_schema(r.choices[0].message.content)


def test_json_object_and_streaming(client):
    r = chat(client, response_format={"type": "json_object"}, temperature=1.0, seed=3,
             max_tokens=300)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    fmt = {"type": "json_schema", "json_schema": {"name": "cat", "schema": SCHEMA}}
    text = "".join(c.choices[0].delta.content or "" for c in chat(
        client, response_format=fmt, temperature=1.0, seed=4, stream=True) if c.choices)
    check_schema(text)


def test_guided_regex_on_completions(client):
    r = client.completions.create(model="tiny-smollm2-shape", prompt="Code:", max_tokens=20, temperature=1.0,
                                  extra_body={"guided_regex": r"[A-Z]{2}-[0-9]{4}"})
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{4}", r.choices[0].text)


CHOICES = ["yes", "no", 'a "quoted" (one)?', "üñï ☃ \\ back\nslash"]


@pytest.mark.parametrize("how", ["structured_outputs", "guided_choice"])
def test_a_choice_answers_exactly_one_of_its_strings(client, how):
    extra = {"structured_outputs": {"choice": CHOICES}} if how == "structured_outputs" \
        else {"guided_choice": CHOICES}
    seen = set()
    for seed in range(6):
        r = chat(client, temperature=1.0, seed=seed, extra_body=extra)
        assert r.choices[0].finish_reason == "stop"
        assert r.choices[0].message.content in CHOICES
        seen.add(r.choices[0].message.content)
    assert len(seen) > 1  # sampled among them, not one string forced


def test_structured_outputs_json_and_regex(client):
    r = chat(client, temperature=1.0, seed=5, extra_body={"structured_outputs": {"json": SCHEMA}})
    check_schema(r.choices[0].message.content)
    r = client.completions.create(model="tiny-smollm2-shape", prompt="Code:", max_tokens=20,
                                  temperature=1.0, seed=2,
                                  extra_body={"structured_outputs": {"regex": r"[A-Z]{2}-[0-9]{4}"}})
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{4}", r.choices[0].text)


@pytest.mark.parametrize("body, param", [
    ({"extra_body": {"structured_outputs": {"choice": ["a"], "regex": "b"}}}, "structured_outputs"),
    ({"extra_body": {"structured_outputs": {"structural_tag": "x"}}}, "structured_outputs"),
    ({"extra_body": {"structured_outputs": {"json_object": False}}}, "structured_outputs"),
    ({"extra_body": {"guided_choice": []}}, "guided_choice"),
    ({"extra_body": {"guided_choice": ["a", ""]}}, "guided_choice"),
    ({"extra_body": {"structured_outputs": {"regex": "a"}, "guided_json": SCHEMA}},
     "guided_json"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                                                                 "schema": {"type": "nope"}}}},
     "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"extra_body": {"guided_regex": "(a"}}, "guided_regex"),
    ({"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a"}},
     "guided_regex"),
])
def test_bad_structure_is_a_400(client, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, **body)
    assert e.value.body["param"] == param


# Properties listed out of alphabetical order: OpenAI's structured outputs write them in the
# schema's order.
ORDERED = {"type": "object",
           "properties": {"zebra": {"type": "boolean"},
                          "apple": {"type": "integer", "minimum": 0, "maximum": 9},
                          "mango": {"enum": ["a", "b"]}},
           "required": ["zebra", "apple", "mango"], "additionalProperties": False}


def test_json_schema_properties_come_in_the_schemas_order(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "ordered", "schema": ORDERED,
                                                  "strict": True}}
    for seed in range(2):
        r = chat(client, response_format=fmt, temperature=1.0, seed=seed, max_tokens=60)
        assert r.choices[0].finish_reason == "stop"
        assert list(json.loads(r.choices[0].message.content)) == list(ORDERED["properties"])


def test_llguidance_itself_keeps_the_schemas_property_order(smollm2_dir):
    """What the server needs of the grammar library: a schema compiled as written lets its
    properties come in its order only (the order compile_grammar keeps, above)."""
    import llguidance

    from tileinfer import load_tokenizer
    from tileinfer.backend.grammar import ll_tokenizer

    tok = load_tokenizer(smollm2_dir)
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(ORDERED), defaults={"whitespace_flexible": False})

    def accepts(text: str) -> bool:
        matcher = llguidance.LLMatcher(ll_tokenizer(tok), grammar)
        ok = matcher.consume_tokens(tok.encode(text, add_special_tokens=False))
        return ok and not matcher.is_error() and matcher.is_accepting()

    assert accepts('{"zebra":true,"apple":3,"mango":"a"}')
    assert not accepts('{"apple":3,"mango":"a","zebra":true}')
