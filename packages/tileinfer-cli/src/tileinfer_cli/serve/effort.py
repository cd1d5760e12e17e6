"""OpenAI's ``reasoning_effort`` (chat) and ``reasoning.effort`` (Responses API) as a thinking
model's switch.

This server has one lever on how much a model thinks: the ``enable_thinking`` variable that
thinking templates (Qwen3, SmolLM3) read, as ``chat_template_kwargs`` and ollama's ``think``
set it. So ``"none"`` and ``"minimal"`` turn the thinking off and every other effort turns it
on; how long the model thinks is its own affair. A template without that variable ignores it,
so a model without a thinking mode (or one that always thinks) answers as it would without the
field. An effort that contradicts the request's own ``chat_template_kwargs.enable_thinking`` is
a 400: the request asks for both.
"""

from __future__ import annotations

from typing import Literal

from .errors import bad_request

# The values OpenAI's API (and its ``openai`` client's ReasoningEffort) names.
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
_OFF = ("none", "minimal")


def template_kwargs(effort: str | None, kwargs: dict | None, param: str) -> dict | None:
    """The chat template's kwargs of a request: its chat_template_kwargs, with enable_thinking
    set by its effort (param: the request's name of the effort)."""
    if effort is None:
        return kwargs
    thinking = effort not in _OFF
    given = (kwargs or {}).get("enable_thinking")
    if given is not None and given != thinking:
        raise bad_request(f"{param} {effort!r} turns the thinking {'on' if thinking else 'off'}, "
                          f"but chat_template_kwargs.enable_thinking is {given!r}: give one",
                          param)
    return {**(kwargs or {}), "enable_thinking": thinking}
