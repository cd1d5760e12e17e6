"""JSON schemas as grammars compile them: every ``number`` with at most ``FRACTION_DIGITS``
fraction digits.

A JSON number may have any number of digits, so a grammar from a schema lets a sampled model
write ``202.000103982231...`` until it runs out of tokens, and the answer, cut inside the number,
is not JSON. Adding ``multipleOf: 10 ** -FRACTION_DIGITS`` to each number schema that has no
``multipleOf`` keeps every answer the grammar allows valid for the original schema (a multiple
of 1e-6 is a number), while llguidance then allows at most that many fraction digits and no
exponent. Integers are left as they are.

Only schema positions are visited (properties, items, anyOf, $defs, ...), never data such as
``enum``, ``const``, ``default`` or ``examples``.
"""

from __future__ import annotations

FRACTION_DIGITS = 6

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
                  "propertyNames", "unevaluatedItems", "unevaluatedProperties")


def bounded_numbers(schema):
    """A copy of schema with ``multipleOf`` added to its number schemas (see the module)."""
    if not isinstance(schema, dict):
        return schema  # true / false
    out = dict(schema)
    types = schema.get("type")
    if (types == "number" or (isinstance(types, list) and "number" in types)) \
            and "multipleOf" not in schema:
        out["multipleOf"] = 10.0 ** -FRACTION_DIGITS
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {name: bounded_numbers(s) for name, s in schema[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            out[key] = [bounded_numbers(s) for s in schema[key]]
    for key in _SCHEMA_VALUES:
        if key in schema:
            value = schema[key]
            out[key] = ([bounded_numbers(s) for s in value] if isinstance(value, list)
                        else bounded_numbers(value))
    return out
