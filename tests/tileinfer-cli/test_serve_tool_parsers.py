"""Tool calls read from model answers (``tileinfer_cli.serve.tool_parsers``), without a server:
the Llama 3.x, Qwen3 and Mistral formats as those models write them, several calls, nested and
non-ASCII arguments, text around the calls, malformed JSON kept as content; and a stream's
partial parses, which only ever grow into the whole answer's."""

from __future__ import annotations

import json

import pytest

from tileinfer_cli.serve.tool_parsers import ParsedCall, detect, tool_parser

NESTED = {"city": "Zürich", "when": {"days": [1, 2], "tz": "Europe/Zurich"},
          "note": "日本 😀 \"q\""}


def args(call: ParsedCall) -> dict:
    return json.loads(call.arguments)


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- Qwen3 ------------------------------------------------------------------------------------

def qwen_call(name, arguments) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {dumps(arguments)}}}\n</tool_call>'


def test_qwen3_several_calls_with_text_around():
    text = (f"<think>\nThe user wants weather.\n</think>\n\n{qwen_call('get_weather', NESTED)}\n"
            f"{qwen_call('get_time', {})}")
    content, calls = tool_parser("qwen3").parse(text)
    assert content == "<think>\nThe user wants weather.\n</think>"
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert args(calls[0]) == NESTED and args(calls[1]) == {}
    assert "Zürich" in calls[0].arguments  # not escaped to \\u sequences


def test_qwen3_malformed_calls_stay_content():
    bad = '<tool_call>\n{"name": "f", "arguments": {"x": 1}\n</tool_call>'  # a brace short
    no_name = '<tool_call>\n{"arguments": {}}\n</tool_call>'
    text = f"Checking.\n{qwen_call('f', {'x': 1})}\n{bad}\nthen {no_name}"
    content, calls = tool_parser("qwen3").parse(text)
    assert [c.name for c in calls] == ["f"]
    assert content == f"Checking.\n{bad}\nthen {no_name}"


def test_qwen3_unclosed_call_at_the_end():
    parser = tool_parser("qwen3")
    content, calls = parser.parse('Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": "b"}}\n')
    assert content == "Sure." and calls == [ParsedCall("f", '{"a": "b"}')]
    cut = 'Sure.\n<tool_call>\n{"name": "f", "argu'  # max_tokens cut it
    assert parser.parse(cut) == (cut, [])


def test_text_without_calls_is_the_content_unchanged():
    text = "  Plain answer with <b>tags</b>, [brackets] and {braces}.\n"
    for name in ("qwen3", "mistral"):
        assert tool_parser(name).parse(text) == (text, [])
    assert tool_parser("llama3").parse(text) == (text, [])


# -- Llama 3.x --------------------------------------------------------------------------------

def test_llama3_bare_json_and_python_tag():
    parser = tool_parser("llama3")
    text = dumps({"name": "get_weather", "parameters": NESTED})
    content, calls = parser.parse(text)
    assert content == "" and [c.name for c in calls] == ["get_weather"]
    assert args(calls[0]) == NESTED
    # Llama 3.1 after <|python_tag|>, several calls separated by ";", and a text before.
    text = ('Let me look.<|python_tag|>{"name": "a", "parameters": {"x": 1}}; '
            '{"name": "b", "parameters": {"y": [1, {"z": null}]}}')
    content, calls = parser.parse(text)
    assert content == "Let me look." and [c.name for c in calls] == ["a", "b"]
    assert args(calls[1]) == {"y": [1, {"z": None}]}


def test_llama3_json_that_is_not_a_call_stays_content():
    parser = tool_parser("llama3")
    for text in ('{"answer": 42}', '{"name": "f", "parameters": "not an object"}',
                 '{"name": "f", "parameters": {"x": 1}', '<|python_tag|>print("hi")',
                 '{"name": "f"}'):
        assert parser.parse(text) == (text, []), text
    # A good call, then a broken one: the call, and the rest as written.
    content, calls = parser.parse('{"name": "f", "parameters": {}}; {"name": "g", "par')
    assert [c.name for c in calls] == ["f"] and content == '{"name": "g", "par'


# -- Mistral ----------------------------------------------------------------------------------

def test_mistral_list_of_calls():
    parser = tool_parser("mistral")
    text = ("[TOOL_CALLS]" + dumps([{"name": "get_weather", "arguments": NESTED},
                                    {"name": "get_time", "arguments": {"tz": "UTC"}}]))
    content, calls = parser.parse(text)
    assert content == "" and [c.name for c in calls] == ["get_weather", "get_time"]
    assert args(calls[0]) == NESTED
    content, calls = parser.parse('I will check. [TOOL_CALLS][{"name": "f", "arguments": {}}]')
    assert content == "I will check." and calls == [ParsedCall("f", "{}")]


def test_mistral_malformed_list_stays_content():
    parser = tool_parser("mistral")
    for text in ('[TOOL_CALLS][{"name": "f", "arguments": {}}', '[TOOL_CALLS][]',
                 '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"arguments": {}}]',
                 '[TOOL_CALLS] not json'):
        assert parser.parse(text) == (text, []), text


# -- streaming --------------------------------------------------------------------------------

ANSWERS = {
    "qwen3": f"Checking.\n{qwen_call('f', NESTED)}\n<tool_call>\n{{bad}}\n</tool_call>\n"
             f"{qwen_call('g', {})} Done <tool",
    "llama3": 'Hm.<|python_tag|>{"name": "a", "parameters": {"x": "ü"}};{"name": "b", '
              '"parameters": {}}',
    "mistral": 'Sure [TOOL_CALLS][{"name": "f", "arguments": {"k": [1, 2]}}] after',
}


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_partial_parses_grow_into_the_whole_answers(name):
    parser, text = tool_parser(name), ANSWERS[name]
    final = parser.parse(text)
    assert final[1], final
    seen_content, seen_calls = "", []
    for k in range(len(text) + 1):
        content, calls = parser.parse(text[:k], final=False)
        assert content.startswith(seen_content) and final[0].startswith(content), (k, content)
        assert calls[:len(seen_calls)] == seen_calls and final[1][:len(calls)] == calls, k
        seen_content, seen_calls = content, calls
    # Nothing of the format's marker is given as content before it is known not to be one.
    for k in range(1, len(parser.marker)):
        content, _ = parser.parse("Hi " + parser.marker[:k], final=False)
        assert content == "Hi", (k, content)


def test_llama3_holds_an_answer_that_starts_like_a_call():
    parser = tool_parser("llama3")
    assert parser.parse("  ", final=False) == ("", [])
    assert parser.parse('{"name": "f", "param', final=False) == ("", [])
    assert parser.parse('{"answer": 1} and more', final=False) == ('{"answer": 1} and more', [])


# -- cut by max_tokens ---------------------------------------------------------------------------

CUTS = [  # (format, an answer max_tokens cut) -> (content, the calls' names)
    ("qwen3", f"Hi.\n{qwen_call('f', {})}\n<tool_call>\n{{\"name\": \"g\", \"argu", ("Hi.", ["f"])),
    ("qwen3", f"Hi.\n{qwen_call('f', {})}\n<tool_c", ("Hi.", ["f"])),
    ("qwen3", "Hello there <tool", ("Hello there", [])),
    ("qwen3", 'Hi <tool_call>\n{"name": "g", "arguments": {}}\n', ("Hi", ["g"])),  # JSON whole
    ("qwen3", "a < b", ("a < b", [])),
    ("llama3", '{"name": "f", "parameters": {}}; {"name": "g", "par', ("", ["f"])),
    ("llama3", '{"na', ("", [])),
    ("llama3", '{"answer": 4', ('{"answer": 4', [])),  # a JSON answer that is no call
    ("llama3", 'Look.<|python_tag|>{"name": "f", "pa', ("Look.", [])),
    ("llama3", "Look.<|python", ("Look.", [])),
    ("mistral", 'Sure. [TOOL_CALLS][{"name": "f", "arguments": {}}, {"name": "g", "argu',
     ("Sure.", ["f"])),
    ("mistral", 'Sure. [TOOL_CALLS][{"name": "f", "arguments": {}}] and then',
     ("Sure.\nand then", ["f"])),
    ("mistral", "Sure. [TOOL_CALLS] not json", ("Sure. [TOOL_CALLS] not json", [])),
]


@pytest.mark.parametrize("name, text, expected", CUTS)
def test_a_cut_answer_loses_the_call_it_was_writing(name, text, expected):
    content, calls = tool_parser(name).parse(text, cut=True)
    assert (content, [c.name for c in calls]) == expected


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_a_cut_never_takes_back_what_a_stream_sent(name):
    """At every length, the content and calls a stream has sent are the start of the cut
    answer's, so a stream that max_tokens ends sends no text it would have to retract."""
    parser, text = tool_parser(name), ANSWERS[name]
    for k in range(len(text) + 1):
        sent, sent_calls = parser.parse(text[:k], final=False)
        content, calls = parser.parse(text[:k], cut=True)
        assert content.startswith(sent) and calls[:len(sent_calls)] == sent_calls, k
        assert parser.marker not in content or parser.marker in text[:k].replace(
            parser.marker, "", 1) or "bad" in content, (k, content)


# -- which format ------------------------------------------------------------------------------

@pytest.mark.parametrize("model,expected", [("Qwen3-0.6B", "qwen3"),
                                            ("Llama-3.1-8B-Instruct", "llama3"),
                                            ("Llama-3.2-1B-Instruct", "llama3"),
                                            ("Mistral-Nemo-Instruct-2407", "mistral"),
                                            ("Apertus-8B-Instruct-2509", None)])
def test_the_format_comes_from_the_chat_template(shared_dir, model, expected):
    source = (shared_dir / "fixtures" / "models" / model / "chat_template.jinja").read_text()
    assert detect(source) == expected


def test_without_a_template_sign_the_tokenizer_decides():
    class Vocab:
        def __init__(self, tokens):
            self.tokens = tokens

        def token_to_id(self, token):
            return self.tokens.get(token)

    assert detect("{{ messages }}", Vocab({"[TOOL_CALLS]": 5})) == "mistral"
    assert detect(None, Vocab({})) is None
    assert tool_parser("none") is None and tool_parser(None) is None
