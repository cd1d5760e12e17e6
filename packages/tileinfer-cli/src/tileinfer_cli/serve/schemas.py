"""The request schemas (pydantic), a subset of OpenAI's.

Requests forbid unknown fields: a parameter this server does not implement is refused with a
400 that names it, never ignored; a value of the wrong JSON type too (``strict.py``). A few
OpenAI parameters are accepted only with the value that changes nothing (``suffix: null``,
...), because clients send those defaults explicitly; any other value is refused by name.
``tools`` and ``tool_choice`` are described in ``tools.py``.

Logit processing (``tileinfer.SamplingParams``): OpenAI's ``presence_penalty`` and
``frequency_penalty`` (in [-2, 2]) and ``logit_bias`` (token ids as strings -> a bias in
[-100, 100]), and vLLM's ``repetition_penalty`` (> 0) and ``min_p`` (in [0, 1]).

Extensions (as vLLM names them): ``top_k`` (0 or -1: off), ``repetition_penalty``, ``min_p``,
``ignore_eos`` (do not stop at the model's end-of-sequence tokens: fixed output lengths for
benchmarks), ``min_tokens`` (no stop token before the answer has this many tokens; stop
strings still end it), ``stop_token_ids`` (more tokens that end the answer, ignore_eos or not),
``chat_template_kwargs``, ``continue_final_message`` and ``add_generation_prompt`` (chat), and
the structured outputs ``structured_outputs`` and the older ``guided_json``, ``guided_regex``,
``guided_choice``, ``guided_grammar`` beside OpenAI's ``response_format`` (``structured.py``).
OpenAI's ``store``, ``service_tier`` and ``metadata`` are taken where they ask for nothing this
server would have to do (store false, the default tier; metadata is not kept), as are the chat's
hints ``prompt_cache_key`` and ``safety_identifier`` (ignored); its ``reasoning_effort`` turns a
thinking model's thinking on or off (``effort.py``).

The responses are in ``responses.py``.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .effort import Effort, template_kwargs
from .strict import Strict
from .tools import Tool, ToolChoice

MAX_N = 16  # choices per request
MAX_STOPS = 16
MAX_STOP_IDS = 64
MAX_CHAT_TOP_LOGPROBS = 20
MAX_COMPLETION_LOGPROBS = 5
# What the server gives the chat template (transformers' names): chat_template_kwargs may not
# replace them.
RESERVED_TEMPLATE_VARIABLES = frozenset({
    "messages", "add_generation_prompt", "tools", "documents", "raise_exception",
    "strftime_now", "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
    "mask_token"})


def check_template_kwargs(v):
    """chat_template_kwargs as given, or a ValueError if it sets one of the template's own
    variables."""
    reserved = RESERVED_TEMPLATE_VARIABLES & set(v or {})
    if reserved:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(sorted(reserved))}: "
                         "the chat template's own variables")
    return v


# -- requests ---------------------------------------------------------------------------------

class TextPart(Strict):
    type: Literal["text"]
    text: str


class ToolCallFunction(Strict):
    name: str
    arguments: str | dict  # OpenAI sends a JSON string


class ToolCall(Strict):
    """A tool call of an earlier assistant turn, as a client gives it back."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None: an assistant turn of tool calls only
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant turns
    tool_call_id: str | None = None  # tool turns: the call answered
    # An earlier turn's reasoning, as a thinking model's answer carried it (either name):
    # templates that show it (Qwen3's, after the last user turn) read reasoning_content.
    reasoning_content: str | None = None
    reasoning: str | None = None
    # What OpenAI's own assistant messages carry, so that a client may send one back as it got
    # it: accepted when they say nothing.
    refusal: None = None
    annotations: list | None = None
    audio: None = None
    function_call: None = None

    @field_validator("annotations")
    @classmethod
    def _no_annotations(cls, v, info):
        return _neutral(info.field_name, v, (None, []))

    @model_validator(mode="after")
    def _fields_of_the_role(self):
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("a tool message needs tool_call_id (the call it answers)")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError("only tool messages carry tool_call_id")
        if (self.reasoning_content is not None or self.reasoning is not None) \
                and self.role != "assistant":
            raise ValueError("only assistant messages carry reasoning")
        if None not in (self.reasoning_content, self.reasoning) \
                and self.reasoning_content != self.reasoning:
            raise ValueError("reasoning_content and reasoning differ: give one")
        return self

    def thought(self) -> str | None:
        """The turn's reasoning, under either name."""
        return self.reasoning_content if self.reasoning_content is not None else self.reasoning

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, v):
        for part in v if isinstance(v, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in (None, "text"):
                raise ValueError(f"a content part of type {kind!r}: this server takes text "
                                 "parts only")
        return v

    def text(self) -> str | None:
        """The content as one text: text parts joined by newlines (as vLLM joins them)."""
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class StreamOptions(Strict):
    include_usage: bool = False


def null_is_default(cls, value, info):
    """A field's default where the client sent null (OpenAI's API lets these be null)."""
    return cls.model_fields[info.field_name].default if value is None else value


def _neutral(name: str, value, neutral: tuple):
    if value not in neutral:
        accepted = " or ".join(dict.fromkeys(json.dumps(v) for v in neutral if v is not None))
        raise ValueError(f"{name} is not supported by this server (leave it out or null"
                         f"{', or send ' + accepted if accepted else ''})")
    return value


class _Sampling(Strict):
    """What chat and completions requests share."""

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)  # 0: the most probable token alone
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, ge=-2**63, lt=2**63)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, max_length=256)  # an end-user id; shown in the server log
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    frequency_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    # Structured outputs (structured.py checks and compiles them).
    response_format: dict | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: list[str] | None = None
    structured_outputs: dict | None = None
    logit_bias: dict[str, float] | None = None
    stop_token_ids: list[int] | None = Field(None, max_length=MAX_STOP_IDS)
    # OpenAI's fields that change nothing here: accepted at the values that ask for nothing.
    store: bool | None = None
    service_tier: str | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)

    @field_validator("n", "stream", mode="before")
    @classmethod
    def _null_is_default(cls, v, info):
        return null_is_default(cls, v, info)

    @field_validator("store")
    @classmethod
    def _no_store(cls, v, info):
        return _neutral(info.field_name, v, (None, False))

    @field_validator("service_tier")
    @classmethod
    def _any_tier(cls, v, info):
        return _neutral(info.field_name, v, (None, "auto", "default"))

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        for key, bias in (v or {}).items():
            if not key.isdigit() or not key.isascii():
                raise ValueError(f"logit_bias keys are token ids (digits), got {key!r}")
            if not math.isfinite(bias) or not -100 <= bias <= 100:
                raise ValueError(f"logit_bias of token {key} must be in [-100, 100], got {bias}")
        return v

    def logit_bias_ids(self) -> dict[int, float]:
        return {int(k): b for k, b in (self.logit_bias or {}).items()}

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("a stop string must not be empty")
        return stops

    def stops(self) -> list[str]:
        return list(self.stop or [])


class OpenFinalMessage(Strict):
    """vLLM's chat flags: add_generation_prompt opens an assistant turn after the messages;
    continue_final_message instead leaves the final message open for the model to continue (a
    prefill of the answer). continue_final_message alone turns the generation prompt off; both
    given true are refused, as vLLM refuses them."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False

    @model_validator(mode="after")
    def _one_of_them(self):
        if self.continue_final_message and self.add_generation_prompt:
            if "add_generation_prompt" in self.model_fields_set:
                raise ValueError("continue_final_message and add_generation_prompt cannot both "
                                 "be true: the first continues the final message, the second "
                                 "opens a new one")
            self.add_generation_prompt = False
        return self


class ChatRequest(_Sampling, OpenFinalMessage):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: Effort | None = None  # a thinking model's switch (effort.py)
    # Hints for OpenAI's own prompt cache and abuse checks: the prefix cache needs no key.
    prompt_cache_key: str | None = None
    safety_identifier: str | None = Field(None, max_length=256)

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v):
        return check_template_kwargs(v)

    def template_kwargs(self) -> dict | None:
        """The chat template's kwargs: chat_template_kwargs, and the effort's thinking switch."""
        return template_kwargs(self.reasoning_effort, self.chat_template_kwargs,
                               "reasoning_effort")

    @field_validator("logprobs", mode="before")
    @classmethod
    def _null_logprobs(cls, v, info):
        return null_is_default(cls, v, info)


class CompletionRequest(_Sampling):
    # A text or token ids, or a list of them (each gets n choices).
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(None, ge=0)  # 0: the usage of the prompts only
    logprobs: int | None = Field(None, ge=0, le=MAX_COMPLETION_LOGPROBS)
    echo: bool = False  # the answer starts with the prompt (and its tokens' logprobs)
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("echo", mode="before")
    @classmethod
    def _null_echo(cls, v, info):
        return null_is_default(cls, v, info)

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v, info):
        return _neutral(info.field_name, v, (None,))

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, v, info):
        return _neutral(info.field_name, v, (None, 1))
