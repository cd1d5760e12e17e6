"""The response schemas (pydantic), a subset of OpenAI's: whole answers, streamed chunks, models.

Streamed chunks are written by ``chunks.py`` as JSON text directly (many per step); the chunk
models here describe them and the tests check the written chunks against them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

class PromptTokensDetails(BaseModel):
    cached_tokens: int  # found in the engine's prefix cache


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]  # None: an echoed prompt's first token
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


FinishReason = Literal["stop", "length", "tool_calls"]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class CalledFunction(BaseModel):
    name: str
    arguments: str  # a JSON object, as text


class CalledTool(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class AssistantToolCalls(BaseModel):
    """An answer of a request with tools: content None when the model only called."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[CalledTool]


class AssistantReasoning(BaseModel):
    """An answer of a thinking model (``--reasoning-parser``): its reasoning, under both names
    clients read (DeepSeek's and llama.cpp's reasoning_content, vLLM's reasoning), its content
    (None when it only thought or only called) and its tool calls, if any."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[CalledTool] | None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantToolCalls | AssistantMessage | AssistantReasoning
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class FunctionDelta(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class Delta(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None  # a thinking model's reasoning, under both names
    reasoning: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionChunkChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionChunk(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tileinfer"
    max_model_len: int
    # An extension: {"temperature", "top_p", "top_k", "from_generation_config": [names]}, what
    # a request that leaves them out gets.
    sampling_defaults: dict


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
