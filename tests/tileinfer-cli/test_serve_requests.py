"""``tileinfer serve`` on the tiny random-weight model of ``test_serve_api.py``, with sampling
settings in its generation_config.json and a chat template that writes every message field
(name, tool calls, tool_call_id, null content): sampling defaults and what applications send.
What it answers is checked against the offline engine on the same weights."""

from __future__ import annotations

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module)
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from serve_fixtures import client, http, offline  # noqa: F401 (fixtures)
from test_serve_helpers import ServerProcess, tiny_folder
from tileinfer import SamplingParams, chat_prompt, generate_batch

MODEL = "tiny-smollm2-shape"
GENERATION = {"temperature": 0.6, "top_p": 0.9, "top_k": 20}

# Writes every field a message may carry, and "(none)" for a null content.
TEMPLATE = """\
{%- for m in messages -%}
<|im_start|>{{ m.role }}{% if m.name is defined %} name={{ m.name }}{% endif %}\
{% if m.tool_call_id is defined %} id={{ m.tool_call_id }}{% endif %}
{% if m.content is none %}(none){% else %}{{ m.content }}{% endif %}
{%- if m.tool_calls is defined %}{% for c in m.tool_calls %} call {{ c.id }} \
{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}{% endif %}<|im_end|>
{% endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""


@pytest.fixture(scope="module")
def folder(smollm2_dir, tmp_path_factory):
    return tiny_folder(smollm2_dir, tmp_path_factory.mktemp("serve-requests"),
                       generation=GENERATION, template=TEMPLATE)


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-requests-log") / "server.log"
    s = ServerProcess(["-m", folder, "--load-format", "dummy", "--kv-tokens", "4096",
                       "--max-running", "4"], log)
    try:
        yield s.wait_ready()
    finally:
        rc = s.stop()
    assert rc == 0, s.output()




def offline_text(offline, ids, sampling, max_new, seed):
    model, tok = offline
    tokens = generate_batch(model, [ids], sampling, max_new, seeds=[seed], num_pages=64)[0]
    return tok.decode(tokens)


def test_omitted_sampling_parameters_take_generation_config(server, folder, client, offline):
    card = client.models.list().data[0]
    assert card.sampling_defaults == {**GENERATION, "min_p": 0.0, "repetition_penalty": 1.0,
                                      "from_generation_config": ["temperature", "top_p", "top_k"]}
    assert ("sampling defaults: temperature 0.6, top_p 0.9, top_k 20 (temperature, top_p, top_k "
            "from generation_config.json)") in server.output()
    prompt = "Tell me a story"
    ids = offline[1].encode(prompt)
    text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16,
                                     seed=7).choices[0].text
    assert text == offline_text(offline, ids, SamplingParams(0.6, top_k=20, top_p=0.9), 16, 7)
    # A request that sets one keeps the others' defaults.
    text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, seed=7,
                                     temperature=1.3).choices[0].text
    assert text == offline_text(offline, ids, SamplingParams(1.3, top_k=20, top_p=0.9), 16, 7)


def test_penalties_bias_and_min_p_give_the_engines_tokens(client, offline):
    """OpenAI's presence_penalty, frequency_penalty and logit_bias (string keys), vLLM's
    repetition_penalty and min_p: the text the offline engine gives with those SamplingParams."""
    prompt = "Tell me a story"
    ids = offline[1].encode(prompt)
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, seed=3,
                                      temperature=0.9).choices[0].text
    asked = dict(presence_penalty=1.5, frequency_penalty=0.5, logit_bias={"100": 5.0, "7": -100})
    text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, seed=3,
                                     temperature=0.9, **asked,
                                     extra_body=dict(repetition_penalty=1.4, min_p=0.05)
                                     ).choices[0].text
    expected = offline_text(offline, ids, SamplingParams(
        0.9, top_k=20, top_p=0.9, presence_penalty=1.5, frequency_penalty=0.5,
        logit_bias={100: 5.0, 7: -100}, repetition_penalty=1.4, min_p=0.05), 16, 3)
    assert text == expected and text != plain


def test_chat_takes_them_too(folder, client, offline):
    messages = [{"role": "user", "content": "hi"}]
    ids = offline[1].encode(chat_prompt(folder, messages, add_generation_prompt=True),
                            add_special_tokens=False)
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10,
                                            temperature=0, frequency_penalty=2.0,
                                            logit_bias={"100": 3.0},
                                            extra_body=dict(repetition_penalty=1.5))
    expected = offline_text(offline, ids, SamplingParams(
        frequency_penalty=2.0, logit_bias={100: 3.0}, repetition_penalty=1.5), 10, 0)
    assert answer.choices[0].message.content == expected
    assert expected != offline_text(offline, ids, SamplingParams(), 10, 0)


@pytest.mark.parametrize("body,param", [
    (dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty=-3), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty"), (dict(min_p=1.5), "min_p"),
    (dict(logit_bias={"abc": 1}), "logit_bias"), (dict(logit_bias={"5": 101}), "logit_bias"),
    (dict(logit_bias={"99999999": 1}), "logit_bias"),
])
def test_logit_processing_out_of_range_gets_400(http, body, param):
    r = http.post("/v1/completions", json=dict(prompt="hi", max_tokens=1, **body))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "name": "alice", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
     "content": [{"type": "text", "text": "18 C,"}, {"type": "text", "text": "sunny"}]},
]
# What the template gets: the arguments as an object, the text parts joined by a newline.
AS_TEMPLATE_INPUT = [
    CONVERSATION[0], CONVERSATION[1],
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18 C,\nsunny"},
]


def test_names_tool_calls_and_tool_results_reach_the_template(folder, client, offline):
    prompt = chat_prompt(folder, AS_TEMPLATE_INPUT, add_generation_prompt=True)
    assert "user name=alice" in prompt and "tool name=get_weather id=call_1" in prompt
    assert '(none) call call_1 get_weather{"city": "Paris"}' in prompt
    ids = offline[1].encode(prompt, add_special_tokens=False)
    answer = client.chat.completions.create(model=MODEL, messages=CONVERSATION, max_tokens=10,
                                            temperature=0)
    assert answer.usage.prompt_tokens == len(ids)
    assert answer.choices[0].message.content == offline_text(offline, ids, SamplingParams(), 10, 0)


def test_messages_that_break_the_roles_rules_get_400(http):
    cases = [([{"role": "user", "content": None}], "needs content"),
             ([{"role": "tool", "content": "18 C"}], "needs tool_call_id"),
             ([{"role": "user", "content": "hi", "tool_call_id": "x"}], "only tool messages"),
             ([{"role": "user", "content": "hi", "tool_calls": []}], "only assistant messages"),
             ([{"role": "robot", "content": "hi"}], "messages.0.role")]
    for messages, reason in cases:
        r = http.post("/v1/chat/completions", json={"messages": messages})
        assert r.status_code == 400, r.text
        assert reason in r.json()["error"]["message"], r.text


def test_a_developer_message_is_a_system_message_where_the_template_has_no_developer(
        folder, client, offline):
    """OpenAI's newer name of the system role: this template names no developer role."""
    said = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    meant = [{"role": "system", "content": "Be brief."}, said[1]]
    ids = offline[1].encode(chat_prompt(folder, meant, add_generation_prompt=True),
                            add_special_tokens=False)
    answer = client.chat.completions.create(model=MODEL, messages=said, max_tokens=6,
                                            temperature=0)
    assert answer.usage.prompt_tokens == len(ids)
    assert answer.choices[0].message.content == offline_text(offline, ids, SamplingParams(), 6, 0)


def test_nulls_where_openai_allows_them_take_the_defaults(http):
    chat = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0,
        "n": None, "stream": None, "logprobs": None})
    assert chat.status_code == 200, chat.text
    assert len(chat.json()["choices"]) == 1 and chat.json()["choices"][0]["logprobs"] is None
    completion = http.post("/v1/completions", json={
        "prompt": "hi", "max_tokens": 3, "temperature": 0, "n": None, "stream": None,
        "echo": None})
    assert completion.status_code == 200, completion.text
    assert not completion.json()["choices"][0]["text"].startswith("hi")


def test_top_p_zero_keeps_the_most_probable_token(client):
    """OpenAI takes top_p in [0, 1]: at 0 the nucleus is the most probable token alone, so a
    sampled answer is the greedy one whatever the seed."""
    greedy = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=8,
                                       temperature=0).choices[0].text
    for seed in (1, 2):
        answer = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=8,
                                           temperature=1.0, top_p=0, seed=seed)
        assert answer.choices[0].text == greedy


def test_a_part_other_than_text_is_refused_by_its_type(http):
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    r = http.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what?"}, part]}]})
    assert r.status_code == 400, r.text
    assert "'image_url': this server takes text parts only" in r.json()["error"]["message"]
    suffix = http.post("/v1/completions", json={"prompt": "hi", "suffix": "end"})
    assert suffix.status_code == 400, suffix.text
    assert "(leave it out or null)" in suffix.json()["error"]["message"]


# -- types, as OpenAI's API checks them ---------------------------------------------------------

MINIMAL = {"/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}],
                                    "max_tokens": 1},
           "/v1/completions": {"prompt": "hi", "max_tokens": 1},
           "/v1/responses": {"input": "hi", "max_output_tokens": 1},
           "/v1/embeddings": {"input": "hi"},
           "/tokenize": {"prompt": "hi"},
           "/api/chat": {"messages": [{"role": "user", "content": "hi"}], "stream": False}}


@pytest.mark.parametrize("path, body, param, expected, got", [
    ("/v1/chat/completions", {"max_tokens": "5"}, "max_tokens", "an integer", "a string"),
    ("/v1/chat/completions", {"temperature": "0.5"}, "temperature", "a number", "a string"),
    ("/v1/chat/completions", {"stream": "true"}, "stream", "a boolean", "a string"),
    ("/v1/chat/completions", {"n": 1.5}, "n", "an integer", "a decimal number"),
    ("/v1/chat/completions", {"seed": True}, "seed", "an integer", "a boolean"),
    ("/v1/chat/completions", {"logprobs": 1}, "logprobs", "a boolean", "an integer"),
    ("/v1/chat/completions", {"stop": ["a", 5]}, "stop.1", "a string", "an integer"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]},
     "messages.0.content", "one of a string or an array", "an integer"),
    ("/v1/completions", {"max_tokens": "5"}, "max_tokens", "an integer", "a string"),
    ("/v1/completions", {"echo": "false"}, "echo", "a boolean", "a string"),
    ("/v1/responses", {"max_output_tokens": "5"}, "max_output_tokens", "an integer",
     "a string"),
    ("/v1/embeddings", {"dimensions": "8"}, "dimensions", "an integer", "a string"),
    ("/tokenize", {"add_special_tokens": "false"}, "add_special_tokens", "a boolean",
     "a string"),
    ("/api/chat", {"options": {"num_predict": "5"}}, "options.num_predict", "an integer",
     "a string"),
])
def test_a_value_of_another_type_is_a_400_naming_it(http, path, body, param, expected, got):
    r = http.post(path, json={**MINIMAL[path], **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "message": f"Invalid type for '{param}': expected {expected}, but got {got} instead.",
        "type": "invalid_request_error", "param": param, "code": "invalid_type"}


def test_the_openai_client_gets_openais_error_for_a_string_max_tokens(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens="5")
    assert e.value.status_code == 400 and e.value.body["param"] == "max_tokens"
    assert e.value.body["message"] == ("Invalid type for 'max_tokens': expected an integer, but "
                                       "got a string instead.")


def test_an_integer_is_a_number(http):
    """JSON integers where OpenAI's numbers are floats: taken, and the same answer as the
    floats give."""
    numbers = dict(temperature=1, top_p=1, presence_penalty=0, frequency_penalty=1,
                   repetition_penalty=1, min_p=0)
    texts = []
    for values in (numbers, {k: float(v) for k, v in numbers.items()}):
        r = http.post("/v1/completions", json={"prompt": "Tell me a story", "max_tokens": 12,
                                               "seed": 11, "logit_bias": {"100": 2}, **values})
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["text"])
    assert texts[0] == texts[1] and texts[0]


def test_openais_hints_are_taken_and_change_nothing(client):
    """prompt_cache_key and safety_identifier (chat and responses), and reasoning_effort for a
    model without a thinking mode: the same answer as without them."""
    messages = [{"role": "user", "content": "Tell me a story"}]
    ask = dict(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    plain = client.chat.completions.create(**ask).choices[0].message.content
    hinted = client.chat.completions.create(**ask, prompt_cache_key="story-1",
                                            safety_identifier="user-7", reasoning_effort="low")
    assert hinted.choices[0].message.content == plain
    ask = dict(model=MODEL, input="Tell me a story", max_output_tokens=10, temperature=0)
    plain = client.responses.create(**ask).output_text
    hinted = client.responses.create(**ask, prompt_cache_key="story-1",
                                     safety_identifier="user-7", reasoning={"effort": "none"})
    assert hinted.output_text == plain and hinted.reasoning.effort == "none"


@pytest.mark.parametrize("body", [{"reasoning_effort": "extreme"}, {"reasoning_effort": 3},
                                  {"safety_identifier": "x" * 257}, {"prompt_cache_key": 1}])
def test_openais_newer_fields_are_still_checked(http, body):
    r = http.post("/v1/chat/completions", json={**MINIMAL["/v1/chat/completions"], **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == next(iter(body)), r.text
