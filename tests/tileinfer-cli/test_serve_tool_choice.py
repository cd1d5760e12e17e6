"""``tool_choice`` "required" and a named function through ``tileinfer serve``: the sampler is held
to the call's grammar, so even the tiny random-weight model (which never calls on its own)
answers with a call in the served template's format (Llama 3.x, Qwen3, Mistral), which comes back
as ``tool_calls`` whose arguments validate against the tool's schema; whole and streamed, driven
by the official ``openai`` client."""

from __future__ import annotations

import json

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client", "llguidance"):
    pytest.importorskip(_module)
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from test_serve_helpers import ServerProcess, tiny_folder

TEMPLATES = {"qwen3": "Qwen3-0.6B", "llama3": "Llama-3.2-1B-Instruct",
             "mistral": "Mistral-Nemo-Instruct-2407"}
WEATHER_ARGS = {"type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12},
                               "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city", "days"], "additionalProperties": False}
TIME_ARGS = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
             "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_ARGS}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME_ARGS}}]
SCHEMAS = {"get_weather": WEATHER_ARGS, "get_time": TIME_ARGS}
ASK = [{"role": "user", "content": "What is the weather in Zurich?"}]


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def served(request, smollm2_dir, shared_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"tool-choice-{request.param}")
    template = shared_dir / "fixtures" / "models" / TEMPLATES[request.param] / "chat_template.jinja"
    folder = tiny_folder(smollm2_dir, root, template=template.read_text())
    s = ServerProcess(["-m", folder, "--load-format", "dummy", "--kv-tokens", "4096",
                       "--max-running", "4"], root / "server.log")
    try:
        s.wait_ready()
        yield request.param, openai.OpenAI(base_url=s.url + "/v1", api_key="none", timeout=120,
                                           max_retries=0)
    finally:
        rc = s.stop()
    assert rc == 0, s.output()


def check_calls(calls, names):
    assert calls, "no tool call"
    for call in calls:
        assert call.type == "function" and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_named_function_is_called_once(served, seed):
    name, client = served
    choice = {"type": "function", "function": {"name": "get_time"}}
    answer = client.chat.completions.create(
        model="tiny-smollm2-shape", messages=ASK, tools=TOOLS, tool_choice=choice,
        temperature=1.0, seed=seed, max_tokens=120).choices[0]
    assert answer.finish_reason == "tool_calls", answer
    assert len(answer.message.tool_calls) == 1
    check_calls(answer.message.tool_calls, {"get_time"})


def test_required_calls_one_of_the_tools_whole_and_streamed(served):
    name, client = served
    kwargs = dict(model="tiny-smollm2-shape", messages=ASK, tools=TOOLS, tool_choice="required",
                  parallel_tool_calls=False, temperature=1.0, max_tokens=120)
    answer = client.chat.completions.create(seed=3, **kwargs).choices[0]
    assert answer.finish_reason == "tool_calls", answer
    assert len(answer.message.tool_calls) == 1
    check_calls(answer.message.tool_calls, set(SCHEMAS))
    with client.chat.completions.stream(seed=4, **kwargs) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls", final
    check_calls(final.message.tool_calls, set(SCHEMAS))
