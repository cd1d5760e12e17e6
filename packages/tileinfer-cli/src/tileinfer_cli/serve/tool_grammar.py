"""The grammar that makes an answer a tool call, for ``tool_choice`` ``"required"`` or a named
function: the call written in the served model's format (``tool_parsers``), its arguments a
JSON object valid against the tool's ``parameters`` schema, and nothing else. The sampler is
held to it (structured outputs: ``tileinfer.compile_grammar``, llguidance's Lark dialect with
the call objects as embedded JSON schemas, ``%json``), so even a model that would not call
answers with a call the tool parser reads.

Per format (``parallel``: one or more calls; else exactly one, as for a named function):

    llama3   the call object as the whole answer: {"name": ..., "parameters": {...}}
             (several separated by ";")
    qwen3    <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call> (several, one per line)
    mistral  [TOOL_CALLS] and a JSON list of {"name": ..., "arguments": {...}}

A marker that the tokenizer holds as one special token is referenced by its id (``<[id]>``):
llguidance never matches a special token against literal text.
"""

from __future__ import annotations

import json

from tileinfer.backend.schema_numbers import bounded_numbers

from .errors import bad_request
from .structured import compiled
from .tools import NamedToolChoice

# The JSON of a call: compact (no free white space a sampled model could pad it with).
_COMPACT = {"whitespace_flexible": False}
_ARGUMENT_KEY = {"llama3": "parameters", "qwen3": "arguments", "mistral": "arguments"}


def _call_schema(tool, key: str) -> dict:
    params = tool.function.parameters
    return {"type": "object",
            "properties": {"name": {"const": tool.function.name},
                           key: params if params else {"type": "object"}},
            "required": ["name", key], "additionalProperties": False}


def _literal(tokenizer, text: str) -> str:
    """text as a Lark terminal: its special token's id where the tokenizer has one, else the
    string."""
    token = tokenizer.token_to_id(text)
    if token is not None and token in tokenizer.special_ids:
        return f"<[{token}]>"
    return json.dumps(text)


def call_lark(format_name: str, tools, tokenizer, parallel: bool) -> str:
    """The Lark grammar of an answer of calls to ``tools`` (at least one) in a format."""
    key = _ARGUMENT_KEY[format_name]
    schemas = [bounded_numbers(_call_schema(t, key)) for t in tools]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    rules = [f"call: %json {json.dumps({**schema, 'x-guidance': _COMPACT})}"]
    if format_name == "llama3":
        rules.insert(0, 'start: call (";" call)*' if parallel else "start: call")
    elif format_name == "qwen3":
        opening, closing = _literal(tokenizer, "<tool_call>"), _literal(tokenizer, "</tool_call>")
        rules.insert(0, 'start: block ("\\n" block)*' if parallel else "start: block")
        rules.insert(1, f'block: {opening} "\\n" call "\\n" {closing}')
    else:
        marker = _literal(tokenizer, "[TOOL_CALLS]")
        rules.insert(0, f'start: {marker} "[" call ("," call)* "]"' if parallel
                     else f'start: {marker} "[" call "]"')
    return "\n".join(rules)


def forced_call_grammar(served, tools, choice, parallel: bool):
    """The ``tileinfer.Grammar`` of a request whose tool_choice forces a call ("required", or a
    named function: only that one, called once), else None. A 400 when the server reads no
    calls or the grammar does not compile (a tool's parameters that are no usable schema)."""
    if choice != "required" and not isinstance(choice, NamedToolChoice):
        return None
    if served.tool_parser is None:
        raise bad_request("tool_choice forces a tool call, but this server reads none (start it "
                          "with --tool-parser for the model's format)", "tool_choice")
    if isinstance(choice, NamedToolChoice):
        tools, parallel = [t for t in tools if t.function.name == choice.function.name], False
    lark = call_lark(served.tool_parser.name, tools, served.tokenizer, parallel)
    return compiled(served, "tools", "the tools' call grammar does not compile: ", lark=lark)
