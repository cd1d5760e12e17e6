"""A thinking model's reasoning apart from its answer (``--reasoning-parser``): the split of a
whole answer, the same split streamed in pieces of any size, and through ``tileinfer serve``
(the scripted engine of ``serve_scripted.py``, Qwen3's real chat template, the official
``openai`` client): reasoning_content and reasoning beside the content, whole and streamed, tool
calls read from the content only, an answer cut inside its reasoning, a template that opens the
thinking in the prompt, and earlier turns' reasoning reaching the template."""

from __future__ import annotations

import json
import random

import pytest

from tileinfer_cli.reasoning import ReasoningStream, prompt_is_thinking, split

SPLITS = [  # (answer, the prompt ends inside a think block) -> (reasoning, content)
    (("<think>\nLet me think.\n</think>\n\nParis.", False), ("Let me think.", "Paris.")),
    (("Let me think.\n\n</think>\n\nParis.", True), ("Let me think.", "Paris.")),
    (("Paris.", False), (None, "Paris.")),
    (("  <think>\ncut here", False), ("cut here", None)),
    (("<think>\n\n</think>\n\nHi", False), (None, "Hi")),
    (("a < b </thin k", True), ("a < b </thin k", None)),
    (("<thinking>x", False), (None, "<thinking>x")),
    (("</think>", True), (None, None)),
    (("<think>a</think>b <think>c</think>", False), ("a", "b <think>c</think>")),
    (("Answer first <think>late</think>", False), (None, "Answer first <think>late</think>")),
    (("\n\n<think>\n\nA\n\nB\n\n</think>\n\n\nC\n", False), ("A\n\nB", "C\n")),
    (("x</thinkx</think>y", True), ("x</thinkx", "y")),
    (("  <think>x</think>", True), ("x", None)),
    (("<think>\n", False), (None, None)),
    (("  ", False), (None, "  ")),
]


@pytest.mark.parametrize("case, expected", SPLITS)
def test_split(case, expected):
    assert split(*case) == expected


@pytest.mark.parametrize("case, expected", SPLITS)
def test_streamed_pieces_add_up_to_the_whole_split(case, expected):
    text, thinking = case
    rng = random.Random(text)
    for _ in range(100):
        stream, reasoning, content, at = ReasoningStream(thinking), "", "", 0
        while at < len(text):
            end = min(len(text), at + rng.randint(0, 4))
            r, c = stream.feed(text[at:end], False)
            reasoning, content, at = reasoning + r, content + c, end
        r, c = stream.feed("", True)
        assert (reasoning + r or None, content + c or None) == expected


def test_a_prompt_is_thinking_when_its_last_think_block_is_open():
    assert prompt_is_thinking("<|Assistant|><think>\n")
    assert not prompt_is_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_is_thinking("<|im_start|>assistant\n")


# -- through the server ---------------------------------------------------------------------------

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module)
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from serve_scripted import scripted_server, stop  # noqa: E402
from test_serve_helpers import sse_events, tiny_folder  # noqa: E402

THOUGHT = "Der Nutzer fragt nach dem Wetter.\nIch rufe get_weather auf."
ANSWER = f"<think>\n{THOUGHT}\n</think>\n\nEs ist sonnig in Zürich. 😀"
ASK = [{"role": "user", "content": "Wie ist das Wetter in Zürich?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}, "required": ["city"]}}}
CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>')


def serve(folder):
    server, url, engine = scripted_server(folder)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=60, max_retries=0)
    return server, url, engine, client


@pytest.fixture(scope="module")
def qwen3(smollm2_dir, shared_dir, tmp_path_factory):
    source = shared_dir / "fixtures" / "models" / "Qwen3-0.6B" / "chat_template.jinja"
    folder = tiny_folder(smollm2_dir, tmp_path_factory.mktemp("reasoning-qwen3"),
                         template=source.read_text())
    server, url, engine, client = serve(folder)
    try:
        yield client, url, engine, folder
    finally:
        stop(server)


def streamed(url, body) -> tuple[str, str, list]:
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True},
                      timeout=60) as r:
        events = sse_events(r)
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    for d in deltas:
        assert d.get("reasoning") == d.get("reasoning_content")
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    return reasoning, content, deltas


def test_the_reasoning_comes_beside_the_content(qwen3):
    client, url, engine, folder = qwen3
    engine.script = ANSWER
    message = client.chat.completions.create(model=folder.name, messages=ASK).choices[0].message
    assert message.content == "Es ist sonnig in Zürich. 😀"
    assert message.reasoning_content == THOUGHT and message.reasoning == THOUGHT
    reasoning, content, deltas = streamed(url, {"messages": ASK})
    assert (reasoning, content) == (THOUGHT, message.content)
    kinds = ["r" if d.get("reasoning_content") else "c" for d in deltas if
             d.get("reasoning_content") or d.get("content")]
    assert kinds == sorted(kinds, key="rc".index)  # all the reasoning before the content


def test_tool_calls_are_read_from_the_content(qwen3):
    client, url, engine, folder = qwen3
    engine.script = f"<think>\n{THOUGHT}\n</think>\n\n{CALL}"
    choice = client.chat.completions.create(model=folder.name, messages=ASK,
                                            tools=[WEATHER]).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.reasoning_content == THOUGHT
    call = choice.message.tool_calls[0].function
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Zürich"}
    reasoning, content, deltas = streamed(url, {"messages": ASK, "tools": [WEATHER]})
    assert reasoning == THOUGHT and content == ""
    calls = [c for d in deltas for c in d.get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "get_weather"


def test_an_answer_cut_inside_its_reasoning_is_all_reasoning(qwen3):
    client, url, engine, folder = qwen3
    engine.script = ANSWER
    choice = client.chat.completions.create(model=folder.name, messages=ASK,
                                            max_tokens=6).choices[0]
    assert choice.message.content is None and choice.message.reasoning_content
    assert THOUGHT.startswith(choice.message.reasoning_content)


@pytest.mark.parametrize("name", ["reasoning_content", "reasoning"])
def test_an_earlier_turns_reasoning_reaches_the_template(qwen3, name):
    from transformers.utils.chat_template_utils import render_jinja_template

    client, url, engine, folder = qwen3
    engine.script = "Gern."
    turn = {"role": "assistant", "content": "Sonnig.", name: THOUGHT}
    messages = ASK + [turn]
    client.chat.completions.create(model=folder.name, messages=messages,
                                   extra_body={"continue_final_message": True})
    expected, _ = render_jinja_template(
        conversations=[ASK + [{"role": "assistant", "content": "Sonnig.",
                               "reasoning_content": THOUGHT}]],
        chat_template=(folder / "chat_template.jinja").read_text(), continue_final_message=True)
    prompt = engine.tokenizer.decode(engine.prompts[-1], skip_special_tokens=False)
    assert prompt == expected[0] and THOUGHT in prompt


def test_reasoning_of_a_user_turn_is_a_400(qwen3):
    client, url, engine, folder = qwen3
    with pytest.raises(openai.BadRequestError, match="only assistant messages carry reasoning"):
        client.chat.completions.create(model=folder.name, messages=[
            {"role": "user", "content": "Hi", "reasoning": "x"}])


@pytest.mark.parametrize("effort, thinking", [("none", False), ("minimal", False),
                                             ("low", True), ("medium", True), ("high", True)])
def test_reasoning_effort_turns_the_thinking_off_or_on(qwen3, effort, thinking):
    """OpenAI's reasoning_effort as Qwen3's enable_thinking: the prompt is the one transformers
    renders with that switch, which for none and minimal ends in the empty think block that
    keeps the model from thinking."""
    from transformers.utils.chat_template_utils import render_jinja_template

    client, url, engine, folder = qwen3
    engine.script = "Sonnig."
    client.chat.completions.create(model=folder.name, messages=ASK, reasoning_effort=effort)
    expected, _ = render_jinja_template(
        conversations=[ASK], add_generation_prompt=True, enable_thinking=thinking,
        chat_template=(folder / "chat_template.jinja").read_text())
    prompt = engine.tokenizer.decode(engine.prompts[-1], skip_special_tokens=False)
    assert prompt == expected[0]
    assert prompt.endswith("<think>\n\n</think>\n\n") == (not thinking)


def test_a_reasoning_effort_against_the_requests_enable_thinking_is_a_400(qwen3):
    client, url, engine, folder = qwen3
    engine.script = "Sonnig."
    ask = dict(model=folder.name, messages=ASK)
    thinking = {"chat_template_kwargs": {"enable_thinking": True}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**ask, reasoning_effort="none", extra_body=thinking)
    assert e.value.status_code == 400 and e.value.body["param"] == "reasoning_effort"
    agreed = client.chat.completions.create(**ask, reasoning_effort="high", extra_body=thinking)
    assert agreed.choices[0].message.content == "Sonnig."


# As DeepSeek-R1's distills: earlier answers lose their reasoning, the prompt opens the next.
DEEPSEEK_LIKE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content.split('</think>')[-1] }}"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}")


def test_a_template_that_opens_the_thinking_starts_the_answer_in_it(smollm2_dir, tmp_path):
    folder = tiny_folder(smollm2_dir, tmp_path, template=DEEPSEEK_LIKE)
    server, url, engine, client = serve(folder)
    try:
        engine.script = f"{THOUGHT}\n</think>\n\nSonnig."
        message = client.chat.completions.create(model=folder.name, messages=ASK).choices[0].message
        assert (message.reasoning_content, message.content) == (THOUGHT, "Sonnig.")
        assert streamed(url, {"messages": ASK})[:2] == (THOUGHT, "Sonnig.")
    finally:
        stop(server)


def test_a_model_without_think_tags_keeps_them_in_the_content(smollm2_dir, tmp_path):
    folder = tiny_folder(smollm2_dir, tmp_path)  # SmolLM2's template and vocabulary: no tags
    server, url, engine, client = serve(folder)
    try:
        engine.script = ANSWER
        message = client.chat.completions.create(model=folder.name, messages=ASK).choices[0].message
        assert message.content == ANSWER and getattr(message, "reasoning_content", None) is None
    finally:
        stop(server)


# -- the CLI's --hide-thinking ---------------------------------------------------------------------

def test_hidden_thinking_writes_the_content_only_and_keeps_both():
    import io

    from tileinfer_cli.reasoning import HiddenThinking
    from tileinfer_cli.stops import StopWriter

    out = io.StringIO()
    shown = HiddenThinking(out, thinking=False)
    writer = StopWriter(["STOP"], shown)
    for piece in ("<th", "ink>\nHmm, </th", "ink", ">\n\nThe ans", "wer.ST", "OP and more"):
        try:
            writer.write(piece)
        except Exception:  # StopStringFound ends the answer
            break
    writer.end()
    shown.end()
    assert out.getvalue() == "The answer." == shown.content and shown.reasoning == "Hmm, "


def test_a_chat_turn_hides_the_thinking_and_the_conversation_keeps_it(smollm2_dir):
    import io
    from types import SimpleNamespace

    from tileinfer import load_tokenizer
    from tileinfer_cli.session import chat_turn

    tokenizer = load_tokenizer(smollm2_dir)
    reply = "<think>\nThey greet me.\n</think>\n\nHello!"

    def answer(text, max_new_tokens, on_token):
        for token in tokenizer.encode(reply, add_special_tokens=False):
            on_token(token)
        return reply, None

    session = SimpleNamespace(messages=[], tokenizer=tokenizer, max_tokens=512, turns=0,
                              prompt_ids=lambda messages: [1, 2, 3], reply=answer)
    out = io.StringIO()
    turn = chat_turn(session, "Hi", 64, [], out, hide_thinking=True)
    assert out.getvalue() == "Hello!" and turn.text == reply
