"""Request bodies to pydantic models: one OpenAI-shaped 400 for invalid JSON or the first
problem pydantic finds, naming the parameter."""

from __future__ import annotations

import json

from pydantic import ValidationError

from .errors import APIError, bad_request
from .schemas import ChatRequest, CompletionRequest


def parse_json(body: bytes):
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json")


def validation_error(e: ValidationError, schema=None) -> APIError:
    """A 400 for the first problem pydantic found in a request of ``schema``, naming the
    parameter (``messages.0.role``)."""
    first = e.errors()[0]
    loc = [str(p) for p in first["loc"]]
    if first["type"] == "extra_forbidden":
        name = ".".join(loc)
        return bad_request(f"unsupported parameter: {name}", name, "unsupported_parameter")
    # Union members add their type to the path (stop.str, stop.list[str]): keep request names.
    names = _NAMES | set(schema.model_fields if schema is not None else ())
    param = ".".join(p for p in loc if p.isdigit() or p in names) or None
    message = first["msg"].removeprefix("Value error, ")
    return bad_request(f"{param}: {message}" if param else message, param)


# The request names a problem's path may go through besides the parsed schema's own fields:
# the chat and completions fields, and those of the nested models (messages, tools, the
# Responses API's items and text format).
_NAMES = (set(ChatRequest.model_fields) | set(CompletionRequest.model_fields)
          | {"call_id", "output", "summary", "format", "schema", "effort", "verbosity",
             "reasoning"}
          | {"role", "content", "type", "text", "include_usage", "name", "tool_calls",
             "tool_call_id", "function", "arguments", "id", "tokens", "add_special_tokens",
             "add_generation_prompt", "return_token_strs", "description", "parameters",
             "strict"})


def parse(body, schema):
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return schema.model_validate(body)
    except ValidationError as e:
        raise validation_error(e, schema) from None
