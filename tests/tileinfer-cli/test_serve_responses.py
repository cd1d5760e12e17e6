"""``/v1/responses`` (OpenAI's Responses API) through ``tileinfer serve``, with the scripted
engine of ``serve_scripted.py`` and Qwen3's real chat template, driven by the official
``openai`` client: answers parse as the client's own models (strictly), a stream's events come
in the order its stream helper accepts and add up to the whole answer, the reasoning and the
tool calls come as their items, a conversation of items (an earlier response's output sent back,
then a call's output) is the same prompt as the same conversation sent as chat messages, and
what this server cannot do is refused by name; kept responses go on with previous_response_id,
are read back and deleted. ``test_serve_api.py`` checks answers of the real engine against the
chat endpoint's."""

from __future__ import annotations

import json

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module)
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from openai.types.responses import Response  # noqa: E402
from serve_scripted import scripted_server, stop  # noqa: E402
from tileinfer_cli.serve.responses_store import ResponseStore  # noqa: E402
from test_serve_helpers import tiny_folder  # noqa: E402

THOUGHT = "Der Nutzer fragt nach dem Wetter.\nIch rufe get_weather auf."
TEXT = "Es ist sonnig in Zürich. 😀"
ANSWER = f"<think>\n{THOUGHT}\n</think>\n\n{TEXT}"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
ASK = "Wie ist das Wetter in Zürich?"
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items()
                                                 if k != "type"}}


@pytest.fixture(scope="module")
def qwen3(smollm2_dir, shared_dir, tmp_path_factory):
    source = shared_dir / "fixtures" / "models" / "Qwen3-0.6B" / "chat_template.jinja"
    folder = tiny_folder(smollm2_dir, tmp_path_factory.mktemp("responses-qwen3"),
                         template=source.read_text())
    server, url, engine = scripted_server(folder)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=60, max_retries=0)
    try:
        yield client, url, engine, folder.name
    finally:
        stop(server)


def raw(url: str, body: dict) -> dict:
    r = httpx.post(url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def events(url: str, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) of a streamed answer, as sent."""
    out, name = [], None
    with httpx.stream("POST", url + "/v1/responses", json={**body, "stream": True},
                      timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
                assert data["type"] == name
                out.append((name, data))
    return out


def kinds(response) -> list[str]:
    return [item.type for item in response.output]


def test_a_plain_answer_is_a_message(qwen3):
    client, url, engine, model = qwen3
    engine.script = TEXT
    response = client.responses.create(model=model, input=ASK)
    assert response.status == "completed" and kinds(response) == ["message"]
    assert response.output_text == TEXT and response.store is True
    assert response.usage.output_tokens == len(engine.tokenizer.encode(TEXT,
                                                                       add_special_tokens=False))
    assert response.usage.input_tokens == len(engine.prompts[-1])
    whole = raw(url, {"model": model, "input": ASK})
    Response.model_validate(whole, strict=False)  # every required field, the right types
    assert whole["id"].startswith("resp_") and whole["object"] == "response"


def test_the_stream_adds_up_to_the_whole_answer(qwen3):
    client, url, engine, model = qwen3
    engine.script = ANSWER
    whole = client.responses.create(model=model, input=ASK)
    with client.responses.stream(model=model, input=ASK) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert kinds(final) == kinds(whole) == ["reasoning", "message"]
    assert final.output_text == whole.output_text == "".join(deltas) == TEXT
    assert final.output[0].content[0].text == whole.output[0].content[0].text == THOUGHT
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert 0 < final.usage.output_tokens_details.reasoning_tokens < final.usage.output_tokens
    sent = events(url, {"model": model, "input": ASK})
    assert [d["sequence_number"] for _, d in sent] == list(range(len(sent)))
    names = [n for n, _ in sent]
    assert names[:3] == ["response.created", "response.in_progress",
                         "response.output_item.added"]
    assert names[-1] == "response.completed" and names.count("response.output_item.done") == 2
    reasoning = "".join(d["delta"] for n, d in sent if n == "response.reasoning_text.delta")
    assert reasoning == THOUGHT
    assert max(i for i, n in enumerate(names) if n == "response.reasoning_text.delta") \
        < min(i for i, n in enumerate(names) if n == "response.output_text.delta")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_call_is_a_function_call_item(qwen3, stream):
    client, url, engine, model = qwen3
    engine.script = f"<think>\n{THOUGHT}\n</think>\n\n{CALL}"
    if stream:
        with client.responses.stream(model=model, input=ASK, tools=[WEATHER]) as s:
            response = s.get_final_response()
    else:
        response = client.responses.create(model=model, input=ASK, tools=[WEATHER])
    assert kinds(response) == ["reasoning", "function_call"] and response.status == "completed"
    call = response.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Zürich"}
    assert call.call_id.startswith("call_") and response.tools[0].name == "get_weather"


def test_a_conversation_of_items_is_the_chat_conversation(qwen3):
    """An earlier response's output sent back, the call's output after it, instructions: the
    same prompt as the chat endpoint makes of the same turns as messages."""
    client, url, engine, model = qwen3
    engine.script = f"<think>\n{THOUGHT}\n</think>\n\n{CALL}"
    first = client.responses.create(model=model, input=ASK, tools=[WEATHER])
    call = first.output[1]
    engine.script = TEXT
    items = [{"role": "user", "content": ASK}] + [item.model_dump(exclude_none=True)
                                                  for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "sonnig"})
    answer = client.responses.create(model=model, input=items, tools=[WEATHER],
                                     instructions="Antworte kurz.")
    assert answer.output_text == TEXT and answer.instructions == "Antworte kurz."
    by_items = engine.prompts[-1]
    client.chat.completions.create(model=model, tools=[CHAT_WEATHER], messages=[
        {"role": "system", "content": "Antworte kurz."},
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "reasoning_content": THOUGHT, "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sonnig"}])
    assert by_items == engine.prompts[-1]
    prompt = engine.tokenizer.decode(by_items, skip_special_tokens=False)
    assert "Antworte kurz." in prompt and "sonnig" in prompt and "get_weather" in prompt


def test_parts_and_an_earlier_assistant_text(qwen3):
    client, url, engine, model = qwen3
    engine.script = TEXT
    client.responses.create(model=model, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Hallo"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Hi!", "annotations": []}]},
        {"role": "user", "content": ASK}])
    by_items = engine.prompts[-1]
    client.chat.completions.create(model=model, messages=[
        {"role": "user", "content": "Hallo"}, {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": ASK}])
    assert by_items == engine.prompts[-1]


@pytest.mark.parametrize("body, named", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"background": True}, "background"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"input": []}, "input"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning"),  # not one of OpenAI's efforts
    ({"reasoning": {"summary": "detailed"}}, "reasoning"),
])
def test_what_this_server_cannot_do_is_refused_by_name(qwen3, body, named):
    client, url, engine, model = qwen3
    r = httpx.post(url + "/v1/responses", json={"model": model, "input": ASK, **body},
                   timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert named in (error["param"] or "") or named in error["message"], error


def test_reasoning_effort_is_the_chats(qwen3):
    """reasoning.effort renders the prompt the chat's reasoning_effort renders (Qwen3's thinking
    off for minimal), and the response states it; against enable_thinking it is a 400."""
    client, url, engine, model = qwen3
    engine.script = TEXT
    response = client.responses.create(model=model, input=ASK, reasoning={"effort": "minimal"})
    assert response.reasoning.effort == "minimal" and response.output_text == TEXT
    by_effort = engine.prompts[-1]
    messages = [{"role": "user", "content": ASK}]
    client.chat.completions.create(model=model, messages=messages, reasoning_effort="minimal")
    assert by_effort == engine.prompts[-1]
    client.chat.completions.create(model=model, messages=messages)
    assert by_effort != engine.prompts[-1]  # the thinking is on by default
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model, input=ASK, reasoning={"effort": "high"},
                                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert e.value.body["param"] == "reasoning.effort"


def test_a_named_function_choice_needs_that_tool(qwen3):
    client, url, engine, model = qwen3
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        client.responses.create(model=model, input=ASK, tools=[WEATHER],
                                tool_choice={"type": "function", "name": "get_time"})


def test_a_failure_after_the_stream_began_ends_it_with_response_failed(qwen3):
    client, url, engine, model = qwen3
    engine.script, engine.fail_at = TEXT, 3
    try:
        sent = events(url, {"model": model, "input": ASK})
    finally:
        engine.fail_at = None
    names = [n for n, _ in sent]
    assert "response.output_text.delta" in names and names[-1] == "response.failed"
    failed = sent[-1][1]["response"]
    assert failed["status"] == "failed" and "a scripted failure" in failed["error"]["message"]


def test_previous_response_id_goes_on_from_the_kept_conversation(qwen3):
    """The second request's prompt is the chat of the first's input, its answer (reasoning and
    text) and the new input; the first's instructions do not carry over."""
    client, url, engine, model = qwen3
    engine.script = ANSWER
    first = client.responses.create(model=model, input=ASK, instructions="Antworte kurz.")
    assert first.store is True and first.previous_response_id is None
    engine.script = TEXT
    second = client.responses.create(model=model, previous_response_id=first.id,
                                     input="Und morgen?")
    assert second.previous_response_id == first.id and second.output_text == TEXT
    by_id = engine.prompts[-1]
    client.chat.completions.create(model=model, messages=[
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": TEXT, "reasoning_content": THOUGHT},
        {"role": "user", "content": "Und morgen?"}])
    assert by_id == engine.prompts[-1]
    third = client.responses.create(model=model, previous_response_id=second.id, input="Danke")
    assert "Und morgen?" in engine.tokenizer.decode(engine.prompts[-1]) and third.output_text


def test_a_kept_response_is_read_back_and_deleted(qwen3):
    client, url, engine, model = qwen3
    engine.script = ANSWER
    whole = client.responses.create(model=model, input=ASK)
    with client.responses.stream(model=model, input=ASK) as stream:
        streamed = stream.get_final_response()
    for made in (whole, streamed):
        got = client.responses.retrieve(made.id)
        assert got.id == made.id and got.output_text == TEXT and kinds(got) == kinds(made)
    client.responses.delete(whole.id)
    with pytest.raises(openai.NotFoundError, match="no response"):
        client.responses.retrieve(whole.id)
    unkept = client.responses.create(model=model, input=ASK, store=False)
    assert unkept.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)


def test_the_store_keeps_the_newest():
    store = ResponseStore(2)
    for i in range(3):
        store.put({"id": f"r{i}"}, [{"role": "user", "content": str(i)}])
    assert store.response("r0") is None and store.conversation("r2")[0]["content"] == "2"
    assert store.delete("r1") and not store.delete("r1")
    ResponseStore(0).put({"id": "x"}, [])
    assert ResponseStore(0).response("x") is None
