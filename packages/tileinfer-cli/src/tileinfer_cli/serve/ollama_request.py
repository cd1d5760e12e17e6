"""Ollama's API (``/api/chat``, ``/api/generate``, ``/api/embed``): its requests, and the
OpenAI-shaped requests they amount to, so that tools written for ollama (its Python and
JavaScript clients, and the apps built on them) can use this server.

A chat request is the chat endpoint's with ollama's names: ``options`` holds the sampling
(``num_predict`` is max_tokens, ``repeat_penalty`` is repetition_penalty, ``stop``, ``seed``,
...), ``format`` is ``"json"`` or a JSON schema, ``think`` turns a template's thinking on or off
(``enable_thinking``), and streaming is the default. A generate request is a chat of one user
turn after its ``system`` prompt, or with ``raw`` the prompt completed as it is. The options
that set up llama.cpp's runner (``num_ctx``, ``num_gpu``, ``num_thread``, ``use_mmap``, ...)
change nothing here and are taken; ``keep_alive`` too (the model stays loaded while the server
runs). Sampling this engine does not have (mirostat, tfs_z, typical_p) is refused unless it is
set to its neutral value, as are images, ``suffix``, ``template`` and ``context``. Ollama keeps
``repeat_penalty`` to the last ``repeat_last_n`` tokens; here it applies to the prompt and the
whole answer (transformers' and vLLM's rule).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator

from .embeddings import EmbeddingRequest, plan_embeddings
from .errors import bad_request
from .prepare import plan_chat, plan_completion
from .schemas import ChatRequest, CompletionRequest, _neutral
from .strict import Strict
from .validation import parse


class Options(Strict):
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    num_predict: int | None = None  # -1 (or -2): until the context is full
    stop: list[str] | str | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # llama.cpp's runner settings: nothing to do here.
    num_ctx: int | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    num_thread: int | None = None
    num_keep: int | None = None
    repeat_last_n: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    numa: bool | None = None
    embedding_only: bool | None = None
    penalize_newline: bool | None = None
    # Sampling this engine does not have: only at the values that turn it off.
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    tfs_z: float | None = None
    typical_p: float | None = None

    @field_validator("mirostat")
    @classmethod
    def _no_mirostat(cls, v, info):
        return _neutral(info.field_name, v, (None, 0))

    @field_validator("tfs_z", "typical_p")
    @classmethod
    def _no_filter(cls, v, info):
        return _neutral(info.field_name, v, (None, 1, 1.0))

    def sampling(self) -> dict:
        """The chat / completions request's fields these options set."""
        out = {name: getattr(self, name) for name in ("temperature", "top_k", "top_p", "min_p",
                                                       "seed", "presence_penalty",
                                                       "frequency_penalty")
               if getattr(self, name) is not None}
        if self.repeat_penalty is not None:
            out["repetition_penalty"] = self.repeat_penalty
        if self.num_predict is not None and self.num_predict > 0:
            out["max_tokens"] = self.num_predict
        if self.stop:
            out["stop"] = self.stop
        return out


class ToolFunctionCall(Strict):
    name: str
    arguments: dict | str
    index: int | None = None


class ToolCall(Strict):
    function: ToolFunctionCall
    id: str | None = None
    type: Literal["function"] | None = None


class Message(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    thinking: str | None = None
    images: list | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None

    @field_validator("images")
    @classmethod
    def _no_images(cls, v, info):
        return _neutral(info.field_name, v, (None, []))


class _Common(Strict):
    model: str | None = None
    format: Literal["", "json"] | dict | None = None
    options: Options | None = None
    stream: bool = True  # ollama streams unless told not to
    keep_alive: float | str | None = None
    think: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def common(self) -> dict:
        body: dict[str, Any] = dict(stream=self.stream)
        if self.model is not None:
            body["model"] = self.model
        body.update((self.options or Options()).sampling())
        if self.format == "json":
            body["response_format"] = {"type": "json_object"}
        elif isinstance(self.format, dict):
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "answer", "schema": self.format}}
        return body


class OllamaChatRequest(_Common):
    messages: list[Message] = Field(default_factory=list)
    tools: list[dict] | None = None


class OllamaGenerateRequest(_Common):
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list | None = None

    @field_validator("suffix", "template")
    @classmethod
    def _no_text(cls, v, info):
        return _neutral(info.field_name, v, (None, ""))

    @field_validator("context", "images")
    @classmethod
    def _no_list(cls, v, info):
        return _neutral(info.field_name, v, (None, []))


class OllamaEmbedRequest(Strict):
    model: str | None = None
    input: str | list[str]
    truncate: bool | None = None  # an input past the context is refused either way
    dimensions: int | None = Field(None, ge=1)
    options: Options | None = None
    keep_alive: float | str | None = None


def _messages(messages: list[Message]) -> list[dict]:
    """Chat messages: tool calls get ids (call_0, ...) that the tool turns after them answer in
    order."""
    out, pending = [], []
    for m in messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.role == "assistant" and m.thinking:
            msg["reasoning_content"] = m.thinking
        if m.tool_calls:
            pending = [f"call_{i}" for i in range(len(m.tool_calls))]
            msg["tool_calls"] = [{"id": i, "type": "function", "function": {
                "name": c.function.name, "arguments": c.function.arguments
                if isinstance(c.function.arguments, str) else json.dumps(c.function.arguments)}}
                for i, c in zip(pending, m.tool_calls)]
        if m.role == "tool":
            msg["tool_call_id"] = pending.pop(0) if pending else "call_0"
        out.append(msg)
    return out


def _chat_extras(req: _Common, body: dict) -> dict:
    """body with the request's thinking switch and logprobs, as a chat request takes them."""
    if req.think is not None:
        body["chat_template_kwargs"] = {"enable_thinking": req.think}
    if req.logprobs:
        body.update(logprobs=True, top_logprobs=req.top_logprobs or 0)
    return body


def chat_of(req: OllamaChatRequest) -> ChatRequest:
    if not req.messages:
        raise bad_request("messages: a chat needs at least one message", "messages")
    body = req.common() | {"messages": _messages(req.messages)}
    if req.tools:
        body["tools"] = req.tools
    return parse(_chat_extras(req, body), ChatRequest)


def generate_of(req: OllamaGenerateRequest) -> ChatRequest | CompletionRequest:
    if not req.prompt:
        raise bad_request("prompt: nothing to generate from (an empty prompt loads the model "
                          "in ollama; here it is always loaded)", "prompt")
    body = req.common()
    if req.raw:
        if req.logprobs:
            body.update(logprobs=req.top_logprobs or 0)
        return parse(body | {"prompt": req.prompt}, CompletionRequest)
    system = [{"role": "system", "content": req.system}] if req.system else []
    body["messages"] = system + [{"role": "user", "content": req.prompt}]
    return parse(_chat_extras(req, body), ChatRequest)


def embed_of(req: OllamaEmbedRequest) -> EmbeddingRequest:
    return parse({"input": req.input, "dimensions": req.dimensions}, EmbeddingRequest)


# -- plans ----------------------------------------------------------------------------------------

def plan_ollama_chat(served, req: OllamaChatRequest):
    return plan_chat(served, chat_of(req))


def plan_ollama_generate(served, req: OllamaGenerateRequest):
    """ollama's generate: a chat of one turn, or (raw) a completion that, as ollama's, runs
    until the context is full unless options.num_predict says how long."""
    converted = generate_of(req)
    if isinstance(converted, ChatRequest):
        return plan_chat(served, converted)
    plan = plan_completion(served, converted)
    if req.options is None or req.options.num_predict is None or req.options.num_predict <= 0:
        plan.max_tokens = [served.max_len - len(p) for p in plan.prompts]
    return plan


def plan_ollama_embed(served, req: OllamaEmbedRequest):
    return plan_embeddings(served, embed_of(req))
