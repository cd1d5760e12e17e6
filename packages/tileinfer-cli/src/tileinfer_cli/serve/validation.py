"""Request bodies to pydantic models: one OpenAI-shaped 400 for invalid JSON or the problem
pydantic finds, naming the parameter."""

from __future__ import annotations

import functools
import json
import typing

from pydantic import BaseModel, ValidationError

from .errors import APIError, bad_request


def parse_json(body: bytes):
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise bad_request(f"the request body is not valid JSON: {e}", code="invalid_json")


def validation_error(e: ValidationError, schema) -> APIError:
    """A 400 for the problem pydantic found deepest in a request of ``schema`` (the first of
    those), naming the parameter (``messages.0.role``). A value of the wrong JSON type gets
    OpenAI's message, which lists each type a union takes."""
    names = _field_names(schema)
    errors = [(_param(error, names), error) for error in e.errors()]
    # The deepest: a union's members each report (content.str, content.list[TextPart].0.text),
    # and the one that got furthest says what is wrong.
    param, first = max(errors, key=lambda pe: len(pe[0]))
    if first["type"] == "extra_forbidden":
        name = ".".join(param)
        return bad_request(f"unsupported parameter: {name}", name, "unsupported_parameter")
    name = ".".join(param) or None
    if first["type"] in _JSON_TYPES and name is not None:
        expected = [_JSON_TYPES[err["type"]] for p, err in errors if p == param
                    and err["type"] in _JSON_TYPES]
        return bad_request(f"Invalid type for '{name}': expected {_one_of(expected)}, but got "
                           f"{_json_type(first['input'])} instead.", name, "invalid_type")
    message = first["msg"].removeprefix("Value error, ")
    return bad_request(f"{name}: {message}" if name else message, name)


def _param(error, names) -> tuple[str, ...]:
    """The request's path of a problem (an unknown field's ending in its name): union members
    add their type to it (stop.str, stop.list[str]), which is no request name."""
    loc = [str(p) for p in error["loc"]]
    last = loc.pop() if error["type"] == "extra_forbidden" and loc else None
    return tuple(p for p in loc if p.isdigit() or p in names) + ((last,) if last else ())


# pydantic's errors of a value of another type -> the JSON type it wanted, in OpenAI's words.
_JSON_TYPES = {"int_type": "an integer", "float_type": "a number", "string_type": "a string",
               "bool_type": "a boolean", "list_type": "an array", "dict_type": "an object",
               "model_type": "an object", "model_attributes_type": "an object"}


def _one_of(expected: list[str]) -> str:
    kinds = list(dict.fromkeys(expected))
    if len(kinds) == 1:
        return kinds[0]
    return "one of " + ", ".join(kinds[:-1]) + " or " + kinds[-1]


def _json_type(value) -> str:
    """The JSON type of a parsed value, in OpenAI's words."""
    if value is None:
        return "null"
    for kind, words in ((bool, "a boolean"), (int, "an integer"), (float, "a decimal number"),
                        (str, "a string"), (list, "an array"), (dict, "an object")):
        if isinstance(value, kind):
            return words
    return type(value).__name__


@functools.cache
def _field_names(schema) -> frozenset[str]:
    """The names a problem's path in a request of schema may go through: the fields (as the
    request spells them) of schema and of every model nested in it."""
    names, todo, seen = set(), [schema], set()
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, field in model.model_fields.items():
            names.update((name, field.alias or name))
            todo += _models_in(field.annotation)
    return frozenset(names)


def _models_in(annotation) -> list:
    """The pydantic models an annotation names (in unions, lists, Annotated, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def parse(body, schema):
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        return schema.model_validate(body)
    except ValidationError as e:
        raise validation_error(e, schema) from None
