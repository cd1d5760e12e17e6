"""The model's chat template, read once at start-up, and a chat request's messages as its input.

Messages go to the template as transformers' ``apply_chat_template`` receives OpenAI-shaped
dicts: ``role`` (``developer``, OpenAI's newer name of ``system``, as ``system`` unless the
template names a developer role, as Apertus's does) and ``content`` (text parts joined by
newlines; ``None`` for an assistant turn of tool calls only), and where the client gave them
``name``, ``tool_calls`` (``[{"id", "type", "function": {"name", "arguments"}}]``),
``tool_call_id`` and ``reasoning_content`` (an earlier answer's reasoning, sent back as
``reasoning_content`` or ``reasoning``); a key the client left out is absent, so ``message.name
is defined`` reads as templates expect. Tool-call ``arguments`` that are a JSON object in a
string (OpenAI's form) are passed as the object, as vLLM does: templates write them with
``tojson``. A template that cannot take a null content (one that concatenates it) gets "" in its
place, as llama-server's template engine does for such templates.

A request's ``continue_final_message`` (with ``add_generation_prompt`` false) leaves its final
message open for the model to continue (``tag_final_message``). A request's tools are the
template's ``tools`` (``tools.py``); a folder whose
tokenizer_config.json names several templates renders a request with tools with its "tool_use"
one, as transformers does. The template's variables are the folder's special tokens
(``bos_token``, ...) and the request's ``chat_template_kwargs``; ``schemas.py`` refuses kwargs
that would replace the template's own variables (``RESERVED_TEMPLATE_VARIABLES``).
"""

from __future__ import annotations

import json

from .errors import bad_request, redact


class ServedTemplate:
    def __init__(self, folder):
        from tileinfer.io.chat_template import load_chat_template
        from tileinfer.io.tokenizer_config import special_tokens

        self.special = special_tokens(folder)
        try:
            self.source: str | None = load_chat_template(folder)
            self.tool_source: str | None = load_chat_template(folder, tools=[])
            self.missing: str | None = None
        except ValueError as e:  # no template, or an unreadable tokenizer_config.json
            self.source = self.tool_source = None
            self.missing = str(e)

    def render(self, messages, kwargs: dict | None, add_generation_prompt: bool = True,
               tools: list[dict] | None = None, continue_final_message: bool = False) -> str:
        """The prompt text of a chat request's messages (``schemas.Message``) and tools (the
        dicts the client sent, or None); continue_final_message: without a generation prompt,
        ending with the final message's text for the model to continue it (transformers' and
        vLLM's flag). A 400 when the model has no template or the template refuses the
        conversation."""
        from tileinfer import ChatTemplateError
        from tileinfer.io.chat_template import cut_at_final_message, tag_final_message

        if self.source is None:
            raise bad_request("this model has no chat template: send the prompt text to "
                              "/v1/completions instead", "messages")
        dicts = [as_dict(m) for m in messages]
        if not continue_final_message:
            return self._render(dicts, kwargs, add_generation_prompt, tools)
        try:
            tagged, text = tag_final_message(dicts)
            return cut_at_final_message(self._render(tagged, kwargs, False, tools), text)
        except ChatTemplateError as e:
            raise bad_request(str(e), "messages") from None

    def _render(self, dicts, kwargs, add_generation_prompt, tools) -> str:
        from tileinfer import ChatTemplateError
        from tileinfer.io.chat_template import render_chat_template

        source = self.source if tools is None else self.tool_source
        if "developer" not in source:  # OpenAI's newer name of the system role
            dicts = [{**d, "role": "system"} if d["role"] == "developer" else d for d in dicts]
        variables = {**self.special, **(kwargs or {})}
        if tools is not None:
            variables["tools"] = tools
        try:
            return render_chat_template(source, dicts, add_generation_prompt, **variables)
        except ChatTemplateError as e:
            if not any(d["content"] is None for d in dicts):
                raise bad_request(redact(str(e)), "messages") from None
            error = e
        try:
            blank = [{**d, "content": ""} if d["content"] is None else d for d in dicts]
            return render_chat_template(source, blank, add_generation_prompt, **variables)
        except ChatTemplateError:
            raise bad_request(redact(str(error)), "messages") from None


def as_dict(message) -> dict:
    d = {"role": message.role, "content": message.text()}
    if message.name is not None:
        d["name"] = message.name
    if message.tool_calls is not None:
        d["tool_calls"] = [{"id": c.id, "type": c.type,
                            "function": {"name": c.function.name,
                                         "arguments": _arguments(c.function.arguments)}}
                           for c in message.tool_calls]
    if message.tool_call_id is not None:
        d["tool_call_id"] = message.tool_call_id
    if message.thought() is not None:
        d["reasoning_content"] = message.thought()
    return d


def _arguments(arguments):
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        if isinstance(parsed, dict):
            return parsed
    return arguments
