"""Tools through ``tileinfer serve``, driven by the official ``openai`` client: the request's
tools reach the model's chat template, and answers in the Llama 3.x, Qwen3 and Mistral formats
come back as ``tool_calls``, whole and streamed. A random model would never write a call, so
the engine here answers a scripted text (``serve_scripted.py``); the rest is the real server,
with SmolLM2's tokenizer and the real chat templates of those models."""

from __future__ import annotations

import json
import re

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module)
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from transformers.utils.chat_template_utils import render_jinja_template

from serve_scripted import scripted_server, stop
from test_serve_helpers import sse_events, tiny_folder
from tileinfer.io.tokenizer_config import special_tokens
from tileinfer_cli.serve import responses

TEMPLATES = {"qwen3": "Qwen3-0.6B", "llama3": "Llama-3.2-1B-Instruct",
             "mistral": "Mistral-Nemo-Instruct-2407"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Das Wetter für einen Ort",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {}}}}
ASK = [{"role": "user", "content": "Wie ist das Wetter in Zürich?"}]
NESTED = {"city": "Zürich", "when": {"days": [1, 2]}, "note": "日本 😀 \"q\""}


def dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


# Two calls (the second without arguments) and a text before them, as each model writes them.
ANSWERS = {
    "qwen3": ("Ich sehe nach.\n<tool_call>\n" + dumps({"name": "get_weather", "arguments": NESTED})
              + "\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
              "</tool_call>"),
    "llama3": ("Ich sehe nach.<|python_tag|>" + dumps({"name": "get_weather", "parameters": NESTED})
               + "; {\"name\": \"get_time\", \"parameters\": {}}"),
    "mistral": ("Ich sehe nach.[TOOL_CALLS]" + dumps([{"name": "get_weather", "arguments": NESTED},
                                                     {"name": "get_time", "arguments": {}}])),
}


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def served(request, smollm2_dir, shared_dir, tmp_path_factory):
    name = request.param
    source = (shared_dir / "fixtures" / "models" / TEMPLATES[name] / "chat_template.jinja")
    folder = tiny_folder(smollm2_dir, tmp_path_factory.mktemp(f"tools-{name}"),
                         template=source.read_text())
    server, url, engine = scripted_server(folder)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=60, max_retries=0)
    try:
        yield name, client, url, engine, folder
    finally:
        stop(server)


def check_calls(name, calls):
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].function.arguments) == NESTED
    assert json.loads(calls[1].function.arguments) == {}
    ids = [c.id for c in calls]
    assert len(set(ids)) == 2 and all(c.type == "function" for c in calls)
    pattern = r"[A-Za-z0-9]{9}" if name == "mistral" else r"call_[0-9a-f]{24}"
    assert all(re.fullmatch(pattern, i) for i in ids), ids


def answer_without_calls(client, kwargs, stream) -> tuple[str, str]:
    """A chat answer's content and finish reason, whole or streamed, asserting it has no calls."""
    if stream:
        chunks = list(client.chat.completions.create(**kwargs, stream=True))
        assert not any(c.choices[0].delta.tool_calls for c in chunks)
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        return content, chunks[-1].choices[0].finish_reason
    choice = client.chat.completions.create(**kwargs).choices[0]
    assert choice.message.tool_calls is None
    return choice.message.content, choice.finish_reason


def test_an_answer_of_calls_is_tool_calls(served):
    name, client, url, engine, folder = served
    engine.script = ANSWERS[name]
    answer = client.chat.completions.create(model="tiny-smollm2-shape", messages=ASK,
                                            tools=[WEATHER, TIME])
    # The prompt: the template rendered with the tools as transformers renders it.
    theirs, _ = render_jinja_template(
        conversations=[ASK], tools=[WEATHER, TIME], add_generation_prompt=True,
        chat_template=(folder / "chat_template.jinja").read_text(), **special_tokens(folder))
    assert engine.prompts[-1] == engine.tokenizer.encode(theirs[0], add_special_tokens=False)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Ich sehe nach."
    check_calls(name, choice.message.tool_calls)
    # A call goes back to the template in the next turn (Mistral's wants its 9-letter ids;
    # Llama 3's take one call a turn).
    turn = choice.message.model_dump(exclude_none=True)
    turn["tool_calls"] = turn["tool_calls"][:1]
    follow = ASK + [turn, {"role": "tool", "tool_call_id": turn["tool_calls"][0]["id"],
                           "content": "18 °C"}]
    engine.script = "Es sind 18 °C."
    again = client.chat.completions.create(model="tiny-smollm2-shape", messages=follow,
                                           tools=[WEATHER, TIME])
    assert again.choices[0].message.content == "Es sind 18 °C."
    assert again.choices[0].finish_reason == "stop" and again.choices[0].message.tool_calls is None


def test_streamed_calls_accumulate_as_the_openai_client_does(served):
    name, client, url, engine, folder = served
    engine.script = ANSWERS[name]
    with client.chat.completions.stream(model="tiny-smollm2-shape", messages=ASK,
                                        tools=[WEATHER, TIME]) as stream:
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Ich sehe nach."
    check_calls(name, choice.message.tool_calls)
    # Raw: every chunk fits the schema; no marker text leaks into the content.
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=60, json={
            "messages": ASK, "tools": [WEATHER, TIME], "stream": True}) as r:
        events = sse_events(r)
    chunks = [responses.ChatCompletionChunk.model_validate(e) for e in events[:-1]]
    deltas = [c.choices[0].delta for c in chunks]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == "Ich sehe nach."
    entries = [t for d in deltas for t in d.tool_calls or ()]
    assert [(t.index, t.function.name) for t in entries if t.id] == [(0, "get_weather"),
                                                                     (1, "get_time")]
    finishes = [c.choices[0].finish_reason for c in chunks]
    assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}


@pytest.mark.parametrize("stream", [False, True])
def test_text_and_malformed_calls_stay_content(served, stream):
    name, client, url, engine, folder = served
    broken = {"qwen3": '<tool_call>\n{"name": "get_weather", "arguments": {"city": }\n</tool_call>',
              "llama3": '{"name": "get_weather", "parameters": {"city": "Zürich"',
              "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Z"}'}
    for script in ("Es ist sonnig in Zürich, 18 °C. {x} [y] <z>", broken[name]):
        engine.script = script
        kwargs = dict(model="tiny-smollm2-shape", messages=ASK, tools=[WEATHER])
        content, finish = answer_without_calls(client, kwargs, stream)
        assert content == script and finish == "stop"


def test_tool_choice_none_renders_no_tools_and_reads_no_calls(served):
    name, client, url, engine, folder = served
    engine.script = ANSWERS[name]
    answer = client.chat.completions.create(model="tiny-smollm2-shape", messages=ASK,
                                            tools=[WEATHER], tool_choice="none")
    assert answer.choices[0].message.content == ANSWERS[name]
    assert answer.choices[0].finish_reason == "stop"
    with_none = engine.prompts[-1]
    client.chat.completions.create(model="tiny-smollm2-shape", messages=ASK)
    assert with_none == engine.prompts[-1]
    client.chat.completions.create(model="tiny-smollm2-shape", messages=ASK, tools=[WEATHER],
                                   tool_choice="auto")
    assert engine.tokenizer.decode(engine.prompts[-1]).count("get_weather") == 1


def test_parallel_tool_calls_false_keeps_the_first_call(served):
    name, client, url, engine, folder = served
    engine.script = ANSWERS[name]
    kwargs = dict(model="tiny-smollm2-shape", messages=ASK, tools=[WEATHER, TIME],
                  parallel_tool_calls=False)
    calls = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather"]
    with client.chat.completions.stream(**kwargs) as stream:
        calls = stream.get_final_completion().choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather"]


def test_tool_requests_the_server_cannot_honour_get_400(served):
    name, client, url, engine, folder = served
    cases = [({"tools": [], "tool_choice": "required"}, "tool_choice", "at least one tool"),
             ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
              "tool_choice", "not among the tools"),
             ({"tool_choice": "required", "response_format": {"type": "json_object"}},
              "tool_choice", "cannot be combined"),
             ({"tool_choice": "sometimes"}, "tool_choice", "tool_choice"),
             ({"tools": [WEATHER, WEATHER]}, "tools", "more than one tool is named"),
             ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools.0.function.name",
              "at least 1 character"),
             ({"tools": [{"type": "retrieval"}]}, "tools.0.type", "function"),
             ({"tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]},
              "tools.0.function.extra", "unsupported parameter"),
             ({"tools": {"get_weather": WEATHER}}, "tools", "expected an array")]
    for extra, param, message in cases:
        r = httpx.post(url + "/v1/chat/completions", timeout=60,
                       json={"messages": ASK, "tools": [WEATHER], **extra})
        assert r.status_code == 400, (extra, r.text)
        error = r.json()["error"]
        assert error["param"] == param and message in error["message"], (extra, error)


def test_tokenize_counts_the_tools_as_the_chat_prompt_has_them(served):
    name, client, url, engine, folder = served
    engine.script = "ok"
    client.chat.completions.create(model="tiny-smollm2-shape", messages=ASK, tools=[WEATHER])
    r = httpx.post(url + "/tokenize", timeout=60, json={"messages": ASK, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == engine.prompts[-1]


def test_malformed_tool_fields_get_400_never_500(served):
    name, client, url, engine, folder = served
    for extra in ({"tools": [1]}, {"tools": [None]}, {"tools": [{"function": {"name": "f"}}]},
                  {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
                  {"tool_choice": {"type": "function"}}, {"tool_choice": 3},
                  {"tools": "get_weather"}, {"parallel_tool_calls": [1]}):
        r = httpx.post(url + "/v1/chat/completions", timeout=60, json={"messages": ASK, **extra})
        assert r.status_code == 400, (extra, r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_tool_parser_none_leaves_the_answer_as_text(smollm2_dir, shared_dir, tmp_path):
    source = shared_dir / "fixtures" / "models" / "Qwen3-0.6B" / "chat_template.jinja"
    folder = tiny_folder(smollm2_dir, tmp_path, template=source.read_text())
    server, url, engine = scripted_server(folder, tool_parser="none")
    try:
        engine.script = ANSWERS["qwen3"]
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=60, max_retries=0)
        answer = client.chat.completions.create(model="tiny-smollm2-shape", messages=ASK,
                                                tools=[WEATHER]).choices[0]
        assert answer.message.content == ANSWERS["qwen3"] and answer.finish_reason == "stop"
        assert "get_weather" in engine.tokenizer.decode(engine.prompts[-1])  # still offered
        r = httpx.post(url + "/v1/chat/completions", timeout=60,
                       json={"messages": ASK, "tools": [WEATHER], "tool_choice": "required"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
        assert "reads none" in r.json()["error"]["message"]
    finally:
        stop(server)


# Where each format's second call (get_time) starts in ANSWERS: a cut a few characters later
# leaves that call unfinished.
SECOND_CALL = {"qwen3": "<tool_call>\n{\"name\": \"get_time\"",
               "llama3": "{\"name\": \"get_time\"", "mistral": "{\"name\": \"get_time\""}


def tokens_to(tokenizer, text: str, chars: int) -> int:
    """How many of text's tokens it takes to cover its first chars characters."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return next(k for k in range(len(ids) + 1) if len(tokenizer.decode(ids[:k])) >= chars)


@pytest.mark.parametrize("into", [3, 0])  # a few characters into the call; just its first token
def test_a_call_cut_by_max_tokens_does_not_leak_into_the_content(served, into):
    """max_tokens ends the answer inside its second call: the content is the text before the
    calls, the first call stays, the unfinished one is gone, finish reason "length"; whole and
    streamed, through the openai client."""
    name, client, url, engine, folder = served
    engine.script = ANSWERS[name]
    at = ANSWERS[name].rindex(SECOND_CALL[name]) + into
    max_tokens = tokens_to(engine.tokenizer, ANSWERS[name], at + 1)
    kwargs = dict(model="tiny-smollm2-shape", messages=ASK, tools=[WEATHER, TIME],
                  max_tokens=max_tokens)
    whole = client.chat.completions.create(**kwargs).choices[0]
    assert whole.finish_reason == "length", whole
    assert whole.message.content == "Ich sehe nach."
    assert [c.function.name for c in whole.message.tool_calls] == ["get_weather"]
    assert json.loads(whole.message.tool_calls[0].function.arguments) == NESTED
    # Streamed (the client's stream helper refuses an answer cut by length: the raw chunks).
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    deltas = [c.choices[0].delta for c in chunks]
    assert "".join(d.content or "" for d in deltas) == "Ich sehe nach."
    entries = [t for d in deltas for t in d.tool_calls or ()]
    assert [t.function.name for t in entries if t.id] == ["get_weather"]
    assert json.loads("".join(t.function.arguments or "" for t in entries)) == NESTED
    assert chunks[-1].choices[0].finish_reason == "length"


MARKERS = {"qwen3": "<tool_call>", "llama3": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_cut_in_its_first_call_keeps_only_the_text_before_it(served, stream):
    """tool_choice auto, no call complete: a cut inside the call's marker (spelled in several
    tokens by this tokenizer) or inside the JSON after it leaves the text before the marker."""
    name, client, url, engine, folder = served
    text = "Ich sehe nach."
    script = f"{text}\n{MARKERS[name]}" + '[{"name": "get_weather", "arguments": {}}]'
    engine.script = script
    for chars in (len(text) + 3, len(text) + 1 + len(MARKERS[name]) + 5):
        kwargs = dict(model="tiny-smollm2-shape", messages=ASK, tools=[WEATHER],
                      max_tokens=tokens_to(engine.tokenizer, script, chars))
        content, finish = answer_without_calls(client, kwargs, stream)
        assert finish == "length" and content == text, (chars, content)
