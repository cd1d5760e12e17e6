"""Chat prompts: a model's own Jinja chat template, rendered the way transformers renders it.

transformers' ``apply_chat_template`` (``transformers/utils/chat_template_utils.py``) compiles the
template in an ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension and a ``{% generation %}`` block tag, overrides ``tojson`` (no HTML
escaping, non-ASCII kept), adds the globals ``raise_exception`` and ``strftime_now``, and renders
with ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the tokenizer's named
special tokens (``bos_token``, ``eos_token``, ...) and any extra keyword (``enable_thinking``,
``date_string``, ...). This module does the same, so the prompt matches transformers string for
string. The prompt holds whatever BOS the template writes: encode it with
``add_special_tokens=False``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .tokenizer_config import read_tokenizer_config, special_tokens

CHAT_TEMPLATE_FILE = "chat_template.jinja"


class ChatTemplateError(ValueError):
    """The model has no chat template, the template does not compile, or it refuses the conversation."""


@dataclass
class ChatMessage:
    """One turn of a conversation. role is "system", "user", "assistant" (or "developer", "tool" where
    the template knows them); reasoning_content is an assistant turn's thinking, for templates that
    render it (Qwen3, Apertus)."""

    role: str
    content: str
    reasoning_content: str | None = None

    def as_dict(self) -> dict:
        message = {"role": self.role, "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        return message


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: marks the assistant's text for training masks.
    Rendering just outputs the body, in its own scope as transformers' CallBlock does."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson escapes <, >, & and ' for HTML; chat templates want plain JSON.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


@lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template does not compile (line {e.lineno}): {e.message}") from e


def template_variables(source: str) -> frozenset[str]:
    """The names the template reads from its context (``messages``, ``enable_thinking``, ...):
    what a caller may pass it that changes the prompt. A ChatTemplateError if it does not
    compile."""
    import jinja2.meta

    env = _compile(source).environment  # compiled first: a syntax error is said as _compile says it
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(source)))


def load_chat_template(model_dir: str | Path, *, tools: list | None = None) -> str:
    """The template source of a model folder: chat_template.jinja, else tokenizer_config.json's
    ``chat_template`` (a string, or a list of named templates: "tool_use" when tools are given and it
    exists, else "default")."""
    model_dir = Path(model_dir)
    path = model_dir / CHAT_TEMPLATE_FILE
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = read_tokenizer_config(model_dir).get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        if tools is not None and "tool_use" in named:
            template = named["tool_use"]
        elif "default" in named:
            template = named["default"]
        else:
            raise ChatTemplateError(
                f"{model_dir} has several chat templates ({sorted(map(str, named))}) and none named 'default'"
            )
    if not isinstance(template, str) or not template:
        raise ChatTemplateError(
            f"{model_dir} has no chat template (neither {CHAT_TEMPLATE_FILE} nor a chat_template in tokenizer_config.json)"
        )
    return template


@dataclass(frozen=True)
class TemplateWithTokens:
    """A chat template source used instead of a model's own, rendered with that model folder's
    special tokens (``bos_token``, ...): what ``tileinfer run --chat-template FILE`` passes to
    ``chat_prompt`` (or to ``ChatSession(template=...)``)."""

    source: str
    model_dir: Path


def read_template_file(path: str | Path, model_dir: str | Path) -> TemplateWithTokens:
    """The Jinja chat template in the file ``path``, checked to compile; a ChatTemplateError
    naming the file otherwise."""
    try:
        source = Path(path).expanduser().read_bytes().decode("utf-8")
    except OSError as e:
        raise ChatTemplateError(f"cannot read the chat template {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ChatTemplateError(f"the chat template {path} is not UTF-8 text (byte offset {e.start})") from None
    try:
        _compile(source)
    except ChatTemplateError as e:
        raise ChatTemplateError(f"{path}: {e}") from None
    return TemplateWithTokens(source, Path(model_dir))


def _as_dicts(messages: Iterable[ChatMessage | Mapping]) -> list[dict]:
    out = []
    for m in messages:
        if isinstance(m, ChatMessage):
            out.append(m.as_dict())
        elif isinstance(m, Mapping):
            out.append(dict(m))
        else:
            raise TypeError(f"a chat message is a ChatMessage or a dict, got {type(m).__name__}")
    if not out:
        raise ChatTemplateError("cannot render a chat prompt for an empty conversation")
    return out


def render_chat_template(
    source: str,
    messages: Iterable[ChatMessage | Mapping],
    add_generation_prompt: bool = True,
    /,
    *,
    tools: list | None = None,
    documents: list | None = None,
    **template_kwargs,
) -> str:
    """Render the template ``source`` for ``messages``; ``template_kwargs`` become template variables
    (any name: the first three parameters are positional-only)."""
    template = _compile(source)
    try:
        return template.render(
            messages=_as_dicts(messages),
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **template_kwargs,
        )
    except jinja2.TemplateError as e:
        # raise_exception("...") in the template lands here with the template's own message.
        raise ChatTemplateError(f"the chat template rejected the conversation: {e.message or e}") from e
    except ChatTemplateError:
        raise
    except Exception as e:  # e.g. a TypeError from an operation inside the template
        raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e


def _looks_like_template(text: str) -> bool:
    return "{%" in text or "{{" in text


def chat_prompt(
    model: str | Path,
    messages: Iterable[ChatMessage | Mapping],
    add_generation_prompt: bool = True,
    *,
    continue_final_message: bool = False,
    **template_kwargs,
) -> str:
    """The prompt string for ``messages``, rendered with the model's own chat template.

    ``model`` is a model folder (its chat template and special tokens are used), the template
    source itself (then pass ``bos_token=...`` and the like yourself), or a TemplateWithTokens
    (another template with a folder's special tokens). ``add_generation_prompt``
    opens an assistant turn for the model to complete; ``continue_final_message`` instead
    leaves the final message open, so that the model continues it (a prefill of the answer,
    as transformers renders it: ``tag_final_message``). Other keywords go to the template, e.g.
    ``enable_thinking=False`` for Qwen3, ``tools=[...]``, ``date_string="26 Jul 2024"``.
    """
    if continue_final_message:
        if add_generation_prompt:
            raise ChatTemplateError("continue_final_message continues the final message: pass "
                                    "add_generation_prompt=False with it")
        tagged, text = tag_final_message(_as_dicts(messages))
        return cut_at_final_message(chat_prompt(model, tagged, False, **template_kwargs), text)
    if isinstance(model, TemplateWithTokens):
        variables = {**special_tokens(model.model_dir), **template_kwargs}
        return render_chat_template(model.source, messages, add_generation_prompt, **variables)
    if isinstance(model, str) and _looks_like_template(model):
        return render_chat_template(model, messages, add_generation_prompt, **template_kwargs)
    model_dir = Path(model)
    if not model_dir.is_dir():
        raise ChatTemplateError(f"{model} is neither a model folder nor a chat template")
    source = load_chat_template(model_dir, tools=template_kwargs.get("tools"))
    # The folder's special tokens, which explicit keywords override (as in transformers).
    variables = {**special_tokens(model_dir), **template_kwargs}
    return render_chat_template(source, messages, add_generation_prompt, **variables)


# -- a final message left open ----------------------------------------------------------------
# A client that writes the start of the answer itself (a prefill: {"role": "assistant",
# "content": "The color is"} as the last message) wants the model to go on from there, not to
# answer again in a new turn. transformers' apply_chat_template(continue_final_message=True)
# renders the conversation without a generation prompt, with a tag after the final message's
# text, and cuts the result at the tag, dropping the end-of-turn tokens the template writes after
# the message; vLLM's server takes the same flag. These two functions do the same.

CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "  # transformers' tag


def tag_final_message(messages: list[dict]) -> tuple[list[dict], str]:
    """(a copy of messages whose final message's text ends with CONTINUE_TAG, that text as the
    client gave it). The text is the message's content, or the last text part of a list of
    parts; a ChatTemplateError when it has none."""
    final = dict(messages[-1])
    content = final.get("content")
    if isinstance(content, str):
        text, final["content"] = content, content + CONTINUE_TAG
    elif isinstance(content, (list, tuple)):
        parts = [dict(p) if isinstance(p, Mapping) else p for p in content]
        texts = [p for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if not texts:
            raise ChatTemplateError("continue_final_message: the final message has no text to "
                                    "continue")
        text = texts[-1]["text"]
        texts[-1]["text"] = text + CONTINUE_TAG
        final["content"] = parts
    else:
        raise ChatTemplateError("continue_final_message: the final message has no text to "
                                "continue")
    return messages[:-1] + [final], text


def cut_at_final_message(rendered: str, text: str) -> str:
    """The prompt of a conversation rendered from ``tag_final_message``'s messages: cut at the
    tag, so that it ends with the final message's text (its trailing whitespace too, where the
    template keeps the text as it is; stripped where the template trims it)."""
    tag = CONTINUE_TAG.strip()
    if text.strip() not in rendered or tag not in rendered:
        raise ChatTemplateError("continue_final_message: the chat template does not write the "
                                "final message's text, so it cannot be continued")
    at = rendered.rindex(tag)
    if rendered[at:at + len(CONTINUE_TAG)] == CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()
