"""``POST /tokenize`` and ``/detokenize``, in vLLM's shapes (evaluation harnesses count and cut
prompts with them):

    {"prompt": "text", "add_special_tokens": true}                 -> {"tokens", "count",
    {"messages": [...], "add_generation_prompt": true,                 "max_model_len",
     "continue_final_message": false,                                  "token_strs"}
     "chat_template_kwargs": {...}, "tools": [...]}
    {"tokens": [1, 2, 3]}                                          -> {"prompt": "text"}

A prompt is tokenized as ``/v1/completions`` tokenizes it, messages as ``/v1/chat/completions``
renders and tokenizes them (the special tokens the template writes, none added).
``return_token_strs`` adds each token's own string (the vocabulary's, e.g. ``Ġthe``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from .errors import bad_request
from .schemas import Message, OpenFinalMessage, check_template_kwargs
from .strict import Strict
from .tools import Tool, check_tools, offered
from .validation import parse


class TokenizePrompt(Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class TokenizeChat(OpenFinalMessage):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    add_special_tokens: bool = False
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v):
        return check_template_kwargs(v)


class Detokenize(Strict):
    model: str | None = None
    tokens: list[int]


def tokenize(served, body) -> tuple[dict, str | None]:
    """(the answer of /tokenize, the model the request names) for a parsed body (a
    TokenizeChat when it has messages)."""
    if isinstance(body, dict) and "messages" in body:
        req = parse(body, TokenizeChat)
        check_tools(req.tools, None)
        text = served.template.render(req.messages, req.chat_template_kwargs,
                                      req.add_generation_prompt, offered(req.tools, None),
                                      req.continue_final_message)
        param = "messages"
    else:
        req = parse(body, TokenizePrompt)
        text, param = req.prompt, "prompt"
    try:
        ids = served.tokenizer.encode(text, add_special_tokens=req.add_special_tokens)
    except ValueError as e:  # a lone surrogate
        raise bad_request(str(e), param) from None
    strs = [served.tokenizer.id_to_token(i) for i in ids] if req.return_token_strs else None
    return {"tokens": ids, "count": len(ids), "max_model_len": served.max_len,
            "token_strs": strs}, req.model


def detokenize(served, body) -> tuple[dict, str | None]:
    req = parse(body, Detokenize)
    vocab = served.tokenizer.vocab_size
    bad = [t for t in req.tokens if not 0 <= t < vocab]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})",
                          "tokens")
    return {"prompt": served.tokenizer.decode(req.tokens)}, req.model
