"""``--json-schema FILE`` and ``--regex PATTERN``: answers that follow a JSON schema or a regular
expression (structured outputs through the grammar library of tileinfer-core's ``structured``
extra)."""

from __future__ import annotations

import dataclasses
import json

from .errors import UserError


def add_structure_options(p):
    g = p.add_argument_group("structured output").add_mutually_exclusive_group()
    g.add_argument("--json-schema", metavar="FILE",
                   help="answer with JSON that validates against the JSON schema in FILE")
    g.add_argument("--regex", metavar="PATTERN",
                   help="answer with text that matches the regular expression PATTERN")


def with_structure(args, sampling, tokenizer):
    """``sampling`` with the grammar of --json-schema / --regex, or as it is."""
    schema_file, regex = getattr(args, "json_schema", None), getattr(args, "regex", None)
    if schema_file is None and regex is None:
        return sampling
    from tileinfer import GrammarError, compile_grammar

    try:
        if schema_file is not None:
            try:
                with open(schema_file, encoding="utf-8") as f:
                    schema = json.load(f)
            except OSError as e:
                raise UserError(f"--json-schema: cannot read {schema_file}: "
                                f"{e.strerror or e}") from None
            except ValueError as e:
                raise UserError(f"--json-schema {schema_file}: not JSON: {e}") from None
            grammar = compile_grammar(tokenizer, json_schema=schema)
        else:
            grammar = compile_grammar(tokenizer, regex=regex)
    except GrammarError as e:
        flag = "--json-schema" if schema_file is not None else "--regex"
        raise UserError(f"{flag}: {e}") from None
    except ImportError as e:
        raise UserError(str(e)) from None
    return dataclasses.replace(sampling, structure=grammar)
