"""Structured outputs of a request: OpenAI's ``response_format`` ({"type": "text"},
{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name", "schema", "strict",
"description"}}), vLLM's ``structured_outputs`` ({"json": schema} or {"regex": ...},
{"choice": [...]}, {"grammar": a Lark grammar}, {"json_object": true}) and its older
``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``, compiled for the
served tokenizer (``tileinfer.compile_grammar``, cached). A choice is the Lark grammar of its
strings, each written as a JSON string literal: the answer is exactly one of them. At most one
may be given; a malformed one or one that does not compile is a 400 naming the parameter. A
thinking model's JSON answer (the server splits its reasoning, and ``<think>`` and ``</think>``
are tokens) comes after its thinking, as vLLM starts structured output after the reasoning.
"""

from __future__ import annotations

import json

from .errors import bad_request

_SCHEMA_KEYS = {"name", "schema", "strict", "description"}
# vLLM's structured_outputs keys -> compile_grammar's keywords (grammar: Lark, as guided_grammar)
_STRUCTURED_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice",
                    "grammar": "lark", "json_object": "json_object"}


def _request(req):
    """(parameter name, compile_grammar keyword arguments) or None."""
    given = []
    fmt = req.response_format
    if fmt is not None and fmt.get("type") != "text":
        given.append(("response_format", _format(fmt)))
    if getattr(req, "structured_outputs", None) is not None:
        given.append(("structured_outputs", _structured(req.structured_outputs)))
    for name, key in (("guided_json", "json_schema"), ("guided_regex", "regex"),
                      ("guided_choice", "choice"), ("guided_grammar", "lark")):
        if getattr(req, name, None) is not None:
            given.append((name, {key: getattr(req, name)}))
    if len(given) > 1:
        raise bad_request(f"give one of {', '.join(n for n, _ in given)}", given[1][0])
    if not given:
        return None
    name, kwargs = given[0]
    if "choice" in kwargs:
        kwargs = {"lark": _choice_grammar(kwargs["choice"], name)}
    return name, kwargs


def _structured(spec) -> dict:
    """compile_grammar's keyword of vLLM's structured_outputs (one kind of constraint)."""
    kinds = [k for k, v in spec.items() if v is not None and v is not False]
    unknown = [k for k in kinds if k not in _STRUCTURED_KEYS]
    if unknown or len(kinds) != 1 or (kinds[0] == "json_object" and spec[kinds[0]] is not True):
        raise bad_request("structured_outputs must give one of json, regex, choice, grammar or "
                          '"json_object": true' + (f" (not {', '.join(unknown)})" if unknown
                                                   else ""), "structured_outputs")
    return {_STRUCTURED_KEYS[kinds[0]]: spec[kinds[0]]}


def _choice_grammar(choices, param: str) -> str:
    """The Lark grammar whose only sentences are the given strings."""
    if not isinstance(choices, list) or not choices or \
            not all(isinstance(c, str) and c for c in choices):
        raise bad_request("a choice is a list of one or more non-empty strings", param)
    return "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _format(fmt: dict) -> dict:
    kind = fmt.get("type")
    if kind == "json_object" and set(fmt) == {"type"}:
        return {"json_object": True}
    if kind == "json_schema" and set(fmt) == {"type", "json_schema"}:
        spec = fmt["json_schema"]
        if not isinstance(spec, dict) or not set(spec) <= _SCHEMA_KEYS or "schema" not in spec:
            raise bad_request("response_format.json_schema must be an object with a schema "
                              "(and name, strict, description)", "response_format")
        return {"json_schema": spec["schema"]}
    raise bad_request('response_format must be {"type": "text"}, {"type": "json_object"} or '
                      '{"type": "json_schema", "json_schema": {...}}', "response_format")


def structure_of(served, req, think: str | None = None):
    """The request's ``tileinfer.Grammar``, or None. think: how a thinking model's answer
    starts ("optional": it may think first, "open": the prompt opened the thinking; None: no
    thinking), for a JSON answer to come after the thinking (``compile_grammar``'s think);
    a regex, a choice or a Lark grammar holds from the first token."""
    found = _request(req)
    if found is None:
        return None
    name, kwargs = found
    if think is not None and ("json_schema" in kwargs or "json_object" in kwargs):
        kwargs = {**kwargs, "think": think}
    return compiled(served, name, **kwargs)


def compiled(served, param: str, what: str = "", **kwargs):
    """``compile_grammar(served.tokenizer, **kwargs)``, or a 400 naming ``param`` (its message
    prefixed by ``what``) when the grammar does not compile or llguidance is missing."""
    try:
        from tileinfer import GrammarError, compile_grammar
    except ImportError as e:  # pragma: no cover - the structured extra is missing
        raise bad_request(str(e), param) from None
    try:
        return compile_grammar(served.tokenizer, **kwargs)
    except (GrammarError, ImportError) as e:
        raise bad_request(f"{what}{e}", param) from None
