"""Structured outputs of a request: OpenAI's ``response_format`` ({"type": "text"},
{"type": "json_object"}, {"type": "json_schema", "json_schema": {"name", "schema", "strict",
"description"}}) and vLLM's ``guided_json`` / ``guided_regex`` / ``guided_grammar`` (a Lark
grammar), compiled for the served tokenizer (``tileinfer.compile_grammar``, cached). At most
one may be given; a malformed one or one that does not compile is a 400 naming the parameter.
"""

from __future__ import annotations

from .errors import bad_request

_SCHEMA_KEYS = {"name", "schema", "strict", "description"}


def _request(req):
    """(parameter name, compile_grammar keyword arguments) or None."""
    given = []
    fmt = req.response_format
    if fmt is not None and fmt.get("type") != "text":
        given.append(("response_format", _format(fmt)))
    for name, key in (("guided_json", "json_schema"), ("guided_regex", "regex"),
                      ("guided_grammar", "lark")):
        if getattr(req, name) is not None:
            given.append((name, {key: getattr(req, name)}))
    if len(given) > 1:
        raise bad_request(f"give one of {', '.join(n for n, _ in given)}", given[1][0])
    return given[0] if given else None


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


def structure_of(served, req):
    """The request's ``tileinfer.Grammar``, or None."""
    found = _request(req)
    if found is None:
        return None
    name, kwargs = found
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
