"""Ollama's API (``/api/chat``, ``/api/generate``, ``/api/embed``, ``/api/tags``, ``/api/ps``,
``/api/show``, ``/api/version``) through ``tileinfer serve``, driven by the official ``ollama`` Python client:
with the scripted engine of ``serve_scripted.py`` and Qwen3's real chat template (thinking, tool
calls, streaming, the prompt as the chat endpoint makes it), and what this server cannot do
refused by name. ``test_serve_api.py`` checks the real engine's answers against the OpenAI
endpoints'."""

from __future__ import annotations

import json

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module)
httpx = pytest.importorskip("httpx")
ollama = pytest.importorskip("ollama")
openai = pytest.importorskip("openai")

from serve_scripted import scripted_server, stop  # noqa: E402
from test_serve_helpers import tiny_folder  # noqa: E402

THOUGHT = "Der Nutzer fragt nach dem Wetter."
TEXT = "Es ist sonnig in Zürich. 😀"
ANSWER = f"<think>\n{THOUGHT}\n</think>\n\n{TEXT}"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
ASK = [{"role": "user", "content": "Wie ist das Wetter in Zürich?"}]
# In the key order the ollama client sends a tool in (its model's field order), which the chat
# template writes as it gets it.
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def qwen3(smollm2_dir, shared_dir, tmp_path_factory):
    source = shared_dir / "fixtures" / "models" / "Qwen3-0.6B" / "chat_template.jinja"
    folder = tiny_folder(smollm2_dir, tmp_path_factory.mktemp("ollama-qwen3"),
                         template=source.read_text())
    server, url, engine = scripted_server(folder)
    try:
        yield ollama.Client(host=url, timeout=60), url, engine, folder.name
    finally:
        stop(server)


def test_chat_whole_and_streamed(qwen3):
    client, url, engine, model = qwen3
    engine.script = ANSWER
    whole = client.chat(model=model, messages=ASK, stream=False)
    assert whole.done and whole.done_reason == "stop"
    assert (whole.message.content, whole.message.thinking) == (TEXT, THOUGHT)
    assert whole.prompt_eval_count == len(engine.prompts[-1]) and whole.eval_count > 0
    assert whole.total_duration >= whole.prompt_eval_duration >= 0
    parts = list(client.chat(model=model, messages=ASK, stream=True))
    assert [p.done for p in parts].count(True) == 1 and parts[-1].done
    assert "".join(p.message.content for p in parts) == TEXT
    assert "".join(p.message.thinking or "" for p in parts) == THOUGHT
    with httpx.stream("POST", url + "/api/chat", json={"messages": ASK}, timeout=60) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] and all(not line["done"] for line in lines[:-1])


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_come_with_their_arguments_as_objects(qwen3, stream):
    client, url, engine, model = qwen3
    engine.script = f"<think>\n{THOUGHT}\n</think>\n\n{CALL}"
    if stream:
        calls = [c for p in client.chat(model=model, messages=ASK, tools=[WEATHER], stream=True)
                 for c in p.message.tool_calls or []]
    else:
        calls = client.chat(model=model, messages=ASK, tools=[WEATHER]).message.tool_calls
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == \
        [("get_weather", {"city": "Zürich"})]


def test_a_conversation_with_a_tool_turn_is_the_chat_endpoints_prompt(qwen3):
    client, url, engine, model = qwen3
    engine.script = TEXT
    client.chat(model=model, tools=[WEATHER], think=False, messages=ASK + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "content": "sonnig", "tool_name": "get_weather"}])
    by_ollama = engine.prompts[-1]
    chat = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=60, max_retries=0)
    chat.chat.completions.create(
        model=model, tools=[WEATHER], extra_body={"chat_template_kwargs": {
            "enable_thinking": False}}, messages=ASK + [
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_0", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Z\\u00fcrich"}'}}]},
            {"role": "tool", "content": "sonnig", "tool_call_id": "call_0"}])
    assert by_ollama == engine.prompts[-1]


def test_generate_with_a_system_prompt_and_raw(qwen3):
    client, url, engine, model = qwen3
    engine.script = TEXT
    got = client.generate(model=model, prompt="Hallo", system="Sei kurz.")
    assert got.response == TEXT and got.done
    prompt = engine.tokenizer.decode(engine.prompts[-1], skip_special_tokens=False)
    assert "Sei kurz." in prompt and "<|im_start|>user\nHallo" in prompt
    raw = client.generate(model=model, prompt="Hallo Welt", raw=True, options={"num_predict": 3})
    assert engine.prompts[-1] == engine.tokenizer.encode("Hallo Welt") and raw.eval_count == 3


def test_tags_ps_show_and_version(qwen3):
    client, url, engine, model = qwen3
    assert [m.model for m in client.list().models] == [model]
    assert [m.model for m in client.ps().models] == [model]
    shown = client.show(model)
    assert "<|im_start|>" in shown.template and shown.modelinfo["general.architecture"] == "llama"
    assert {"completion", "tools", "thinking"} <= set(shown.capabilities)
    with pytest.raises(ollama.ResponseError):
        client.show("llama3.2")
    assert httpx.get(url + "/api/version").json()["version"]


@pytest.mark.parametrize("body, named", [
    ({"options": {"mirostat": 2}}, "mirostat"),
    ({"options": {"tfs_z": 0.5}}, "tfs_z"),
    ({"options": {"no_such_option": 1}}, "no_such_option"),
    ({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
    ({"messages": []}, "messages"),
])
def test_what_this_server_cannot_do_is_refused_by_name(qwen3, body, named):
    client, url, engine, model = qwen3
    r = httpx.post(url + "/api/chat", json={"messages": ASK, **body}, timeout=60)
    assert r.status_code == 400 and named in r.text, r.text
