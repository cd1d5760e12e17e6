"""A chat request's ``tools`` (OpenAI function tools) and ``tool_choice``.

The tools go to the chat template as the client sent them (the JSON schema dicts, keys in the
client's order: templates write them with ``tojson`` or key by key, so the order is part of the
prompt), as transformers' ``apply_chat_template(tools=...)`` passes them.

``tool_choice`` ``"auto"`` (the default when there are tools) lets the model answer or call;
``"none"`` renders the prompt without the tools and reads no calls from the answer;
``"required"`` (one or more calls to any of the tools) and a named function (one call to it)
hold the sampler to the call's grammar (``tool_grammar.py``), so the answer is a call.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, model_validator

from .errors import bad_request
from .strict import Strict


class FunctionDefinition(Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict | None = None  # a JSON schema
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDefinition
    _sent: dict = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_as_sent(cls, data, handler):
        tool = handler(data)
        if isinstance(data, dict):
            tool._sent = data
        return tool

    def as_sent(self) -> dict:
        return self._sent or self.model_dump(exclude_unset=True)


class FunctionName(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


def check_tools(tools: list[Tool] | None, choice) -> None:
    """A 400 for two tools of one name, or a tool_choice that forces a call to no tool."""
    names = [t.function.name for t in tools or ()]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise bad_request(f"more than one tool is named {twice[0]!r}", "tools")
    if choice == "required" and not names:
        raise bad_request('tool_choice "required" needs at least one tool', "tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise bad_request(f"tool_choice names function {choice.function.name!r}, which is not "
                          "among the tools", "tool_choice")


def offered(tools: list[Tool] | None, choice) -> list[dict] | None:
    """The tool dicts for the chat template, None when the request offers none (no tools, an
    empty list, or tool_choice "none")."""
    if not tools or choice == "none":
        return None
    return [t.as_sent() for t in tools]
