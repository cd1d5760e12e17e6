"""A chat request's tools and tool-call history rendered by the server's template
(``tileinfer_cli.serve.template``) equal transformers' ``apply_chat_template(tools=...)`` on the
real chat templates of Llama 3.1, Llama 3.2, Qwen3 and Mistral Nemo."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("pydantic")
transformers_templates = pytest.importorskip("transformers.utils.chat_template_utils")

from tileinfer.io.tokenizer_config import special_tokens
from tileinfer_cli.serve.schemas import ChatRequest
from tileinfer_cli.serve.template import ServedTemplate
from tileinfer_cli.serve.tools import offered

from test_serve_helpers import tiny_folder

# Keys in an order of the client's own (not the schema's): it is part of the prompt.
WEATHER = {"function": {"parameters": {"type": "object", "required": ["city"], "properties": {
    "city": {"type": "string", "description": "Stadt, z. B. Zürich <b>&</b>"}}},
    "name": "get_weather", "description": "Wetter \"heute\" für einen Ort"}, "type": "function"}
SEARCH = {"type": "function", "function": {"name": "search", "strict": True, "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}, "filters": {
        "type": "object", "properties": {"lang": {"enum": ["de", "ja"]}}}}}}}
CALL_ID = "a1B2c3D4e"  # Mistral's template takes ids of 9 letters and digits
ARGS = {"city": "Zürich", "opts": {"days": [1, 2], "note": "日本 😀"}}
CONVERSATIONS = {
    "one turn": [{"role": "system", "content": "Nutze Werkzeuge."},
                 {"role": "user", "content": "Wetter in Zürich?"}],
    "after a call": [
        {"role": "user", "content": "Wetter in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": CALL_ID, "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps(ARGS)}}]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": "18 °C, sonnig"}],
}
TEMPLATES = ["Llama-3.1-8B-Instruct", "Llama-3.2-1B-Instruct", "Qwen3-0.6B",
             "Mistral-Nemo-Instruct-2407"]


def as_transformers_gets_it(message: dict) -> dict:
    """The message as the server passes it: tool-call arguments as the object."""
    out = dict(message)
    if out.get("tool_calls"):
        out["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(
            c["function"]["arguments"])}} for c in out["tool_calls"]]
    return out


@pytest.fixture(scope="module")
def folders(smollm2_dir, shared_dir, tmp_path_factory):
    out = {}
    for name in TEMPLATES:
        source = shared_dir / "fixtures" / "models" / name / "chat_template.jinja"
        out[name] = tiny_folder(smollm2_dir, tmp_path_factory.mktemp(name),
                                template=source.read_text())
    return out


@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("name", TEMPLATES)
def test_tools_render_as_transformers_renders_them(folders, name, conversation):
    folder = folders[name]
    messages = CONVERSATIONS[conversation]
    if name.startswith("Mistral") and conversation == "one turn":
        messages = messages[1:]  # its template puts a system message before the last user turn
    req = ChatRequest.model_validate({"messages": messages, "tools": [WEATHER, SEARCH],
                                      "chat_template_kwargs": {"date_string": "1 Jan 2025"}})
    tools = offered(req.tools, req.tool_choice)
    assert tools == [WEATHER, SEARCH] and list(tools[0]) == ["function", "type"]
    ours = ServedTemplate(folder).render(req.messages, req.chat_template_kwargs, tools=tools)
    theirs, _ = transformers_templates.render_jinja_template(
        conversations=[[as_transformers_gets_it(m) for m in messages]], tools=[WEATHER, SEARCH],
        chat_template=(folder / "chat_template.jinja").read_text(), add_generation_prompt=True,
        date_string="1 Jan 2025", **special_tokens(folder))
    assert ours == theirs[0]
    assert "get_weather" in ours and "für einen Ort" in ours


def test_tool_choice_none_renders_as_without_tools(folders):
    folder = folders["Qwen3-0.6B"]
    messages = CONVERSATIONS["one turn"]
    req = ChatRequest.model_validate({"messages": messages, "tools": [WEATHER],
                                      "tool_choice": "none"})
    template = ServedTemplate(folder)
    assert offered(req.tools, req.tool_choice) is None
    plain = template.render(req.messages, None)
    assert plain == template.render(req.messages, None, tools=None) and "get_weather" not in plain
