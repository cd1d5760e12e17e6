"""A request to ``/v1/responses`` (OpenAI's Responses API), and the chat request it amounts to.

The Responses API is the chat with other names: ``input`` (a text, or a list of items: messages,
earlier function calls and their outputs, earlier reasoning) and ``instructions`` (a system
message before them) make the conversation; ``max_output_tokens`` is ``max_tokens``; function
tools are flat (``{"type": "function", "name", "parameters"}``); ``text.format`` is the
``response_format``; ``reasoning.effort`` is ``reasoning_effort``; the hints
``prompt_cache_key`` and ``safety_identifier`` are taken and ignored. So a request is checked
here, turned into the ``ChatRequest`` it means (``chat_request``) and planned as one; only the
answer's shape differs (``responses_format.py``). A client may send an earlier response's
output items back as they came (ids, statuses, annotations and all): an assistant message, the
function calls after it and the reasoning before it become one assistant turn, each call's
output a tool turn.

Responses are kept (``store``, true unless the request says false) in the server's memory
(``responses_store.py``), so a request may go on from one with ``previous_response_id``: its
conversation's items come before the request's input. ``conversation`` objects and
``background`` are refused by name. Text only: images, files and audio are refused. Like the
chat endpoint's, the request takes vLLM's sampling extensions ``top_k``, ``min_p``,
``repetition_penalty`` and ``seed``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter, field_validator

from .effort import Effort, template_kwargs
from .errors import bad_request
from .prepare import plan_chat
from .schemas import MAX_CHAT_TOP_LOGPROBS, ChatRequest, _neutral, check_template_kwargs
from .strict import Strict
from .validation import parse

LOGPROBS_INCLUDE = "message.output_text.logprobs"


# -- input items ----------------------------------------------------------------------------------

class InputText(Strict):
    type: Literal["input_text"]
    text: str


class OutputText(Strict):
    """An earlier answer's text, as the API gave it."""

    type: Literal["output_text"]
    text: str
    annotations: list | None = None
    logprobs: list | None = None


class InputMessage(Strict):
    """A message: the short form (role and content) or an output message sent back."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Annotated[InputText | OutputText, Field(discriminator="type")]]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutput(Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output)


class SummaryText(Strict):
    type: Literal["summary_text"]
    text: str


class ReasoningText(Strict):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(Strict):
    type: Literal["reasoning"]
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    id: str | None = None
    status: str | None = None
    encrypted_content: None = None

    def text(self) -> str:
        parts = self.content if self.content else self.summary
        return "\n\n".join(part.text for part in parts)


def _item_kind(item) -> str:
    """An input item's type; a message may leave it out."""
    if isinstance(item, dict):
        return item.get("type", "message")
    return getattr(item, "type", "message")


InputItem = Annotated[
    Annotated[InputMessage, Tag("message")] | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutput, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind)]


# -- tools, text format ---------------------------------------------------------------------------

class FunctionTool(Strict):
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class NamedFunction(Strict):
    type: Literal["function"]
    name: str


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None  # json_schema's
    schema_: dict | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class TextOptions(Strict):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # the only length this server has


class Reasoning(Strict):
    """effort: the chat's reasoning_effort (``effort.py``); a summary is not made here (a
    thinking model's reasoning comes back as it is), so the others are accepted as null."""

    effort: Effort | None = None
    summary: None = None
    generate_summary: None = None


class ResponsesRequest(Strict):
    model: str | None = None
    input: str | list[InputItem] = Field(min_length=1)
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_CHAT_TOP_LOGPROBS)
    include: list[str] | None = None
    stream: bool = False
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    text: TextOptions | None = None
    reasoning: Reasoning | None = None
    user: str | None = Field(None, max_length=256)
    safety_identifier: str | None = Field(None, max_length=256)
    metadata: dict[str, str] | None = Field(None, max_length=16)
    prompt_cache_key: str | None = None  # a hint for caching: the prefix cache needs none
    store: bool | None = None  # None: true, as OpenAI's default
    truncation: Literal["disabled"] | None = None
    service_tier: str | None = None
    previous_response_id: str | None = None
    conversation: None = None
    background: bool | None = None
    # vLLM's extensions, as the chat endpoint takes them.
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    repetition_penalty: float | None = Field(None, gt=0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=-2**63, lt=2**63)
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("background")
    @classmethod
    def _not_in_background(cls, v, info):
        return _neutral(info.field_name, v, (None, False))

    @field_validator("service_tier")
    @classmethod
    def _any_tier(cls, v, info):
        return _neutral(info.field_name, v, (None, "auto", "default"))

    @field_validator("include")
    @classmethod
    def _includes(cls, v):
        other = [name for name in v or () if name != LOGPROBS_INCLUDE]
        if other:
            raise ValueError(f"include {other[0]!r} is not supported by this server (only "
                             f"{LOGPROBS_INCLUDE!r})")
        return v

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v):
        return check_template_kwargs(v)

    @property
    def logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or ())

    def text_format(self) -> dict:
        """The answer's ``text.format`` as the response states it."""
        f = self.text.format if self.text is not None and self.text.format else None
        return {"type": "text"} if f is None else f.model_dump(by_alias=True, exclude_none=True)


_ITEMS = TypeAdapter(list[InputItem])


def input_items(req: ResponsesRequest) -> list:
    """The request's input as items (a text: one user message)."""
    if isinstance(req.input, str):
        return [InputMessage(role="user", content=req.input)]
    return list(req.input)


def as_dicts(items) -> list[dict]:
    """Items as JSON objects, as a client would send them back."""
    return [item.model_dump(exclude_none=True) for item in items]


def messages_of(req: ResponsesRequest, history: list[dict] = ()) -> list[dict]:
    """The chat messages of the request's instructions, the items of the conversation it goes
    on from (history) and its input (see the module's doc)."""
    messages = [] if req.instructions is None else [{"role": "system",
                                                     "content": req.instructions}]
    thought: str | None = None  # reasoning waiting for the assistant turn it belongs to
    for item in _ITEMS.validate_python(list(history)) + input_items(req):
        last = messages[-1] if messages else None
        if isinstance(item, ReasoningItem):
            thought = item.text()
        elif isinstance(item, InputMessage) and item.role != "assistant":
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallOutput):
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": item.text()})
        else:  # an assistant message, or a call: a new assistant turn unless it continues one
            if last is None or last["role"] != "assistant" or thought is not None \
                    or (isinstance(item, InputMessage) and last.get("tool_calls")):
                last = {"role": "assistant", "content": None}
                if thought is not None:
                    last["reasoning_content"], thought = thought, None
                messages.append(last)
            if isinstance(item, InputMessage):
                last["content"] = (last["content"] or "") + item.text()
            else:
                last.setdefault("tool_calls", []).append({
                    "id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}})
    return messages


def plan_responses(served, req: ResponsesRequest, store):
    """A Responses API request, planned as the chat request it amounts to; the plan's
    ``conversation``: the input items of the conversation so far, the request's own last."""
    history: list[dict] = []
    if req.previous_response_id is not None:
        history = store.conversation(req.previous_response_id)
        if history is None:
            raise bad_request(f"previous_response_id: no response {req.previous_response_id!r} "
                              f"is kept here (the server keeps the newest {store.capacity}, in "
                              "memory)", "previous_response_id", "previous_response_not_found")
    if req.store and store.capacity <= 0:
        raise bad_request("store: this server keeps no responses (--responses-store 0)",
                          "store")
    plan = plan_chat(served, chat_request(req, history))
    plan.conversation = history + as_dicts(input_items(req))
    return plan


def chat_request(req: ResponsesRequest, history: list[dict] = ()) -> ChatRequest:
    """The ChatRequest the request means (a 400 naming the field when it cannot be one)."""
    body: dict[str, Any] = dict(messages=messages_of(req, history), stream=req.stream)
    for name in ("model", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                 "seed", "user", "metadata", "parallel_tool_calls", "chat_template_kwargs"):
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    effort = req.reasoning.effort if req.reasoning is not None else None
    if effort is not None:
        template_kwargs(effort, req.chat_template_kwargs, "reasoning.effort")  # names its field
        body["reasoning_effort"] = effort
    if req.logprobs:
        body.update(logprobs=True, top_logprobs=req.top_logprobs or 0)
    if req.tools is not None:
        body["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"},
                                                                       exclude_unset=True)}
                         for t in req.tools]
    if isinstance(req.tool_choice, NamedFunction):
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
    elif req.tool_choice is not None:
        body["tool_choice"] = req.tool_choice
    f = req.text.format if req.text is not None else None
    if f is not None and f.type == "json_schema":
        if f.schema_ is None:
            raise bad_request("text.format of type json_schema needs a schema", "text.format")
        body["response_format"] = {"type": "json_schema", "json_schema": {
            "name": f.name or "answer", "schema": f.schema_,
            **({} if f.strict is None else {"strict": f.strict})}}
    elif f is not None and f.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    return parse(body, ChatRequest)
