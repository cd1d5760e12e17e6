"""Messages of the library put in the command line's words: the flags a user typed
(``--max-len``, ``--allow-long-context``, ``--max-new-tokens``) instead of the API's arguments
(``max_len``, ``allow_long=True``, ``max_new_tokens``, ``max_tokens``), and an install hint for a
backend of TileInfer's own that is not installed."""

from __future__ import annotations

import re

OUR_BACKENDS = ("triton", "cuda")

_REWRITES = [
    (re.compile(r"use max_len <= (\d+), or insist with allow_long=True"
                r"(?: \(tileinfer: --allow-long-context\))?"),
     r"use --max-len \1 or less, or insist with --allow-long-context"),
    (re.compile(r"\bmax_len (\d+) exceeds"), r"--max-len \1 exceeds"),
    (re.compile(r"the model's max_len (\d+)"), r"the model's --max-len \1"),
    (re.compile(r"\bmax_new_tokens \((\d+)\)"), r"--max-new-tokens (\1)"),
    (re.compile(r"a larger max_tokens\b"), "a larger --max-len"),
]
_UNKNOWN_BACKEND = re.compile(r"^unknown backend '([\w.-]+)'")


def in_cli_words(message: str) -> str:
    for pattern, replacement in _REWRITES:
        message = pattern.sub(replacement, message)
    found = _UNKNOWN_BACKEND.match(message)
    if found and found[1] in OUR_BACKENDS and "TILEINFER_BACKENDS is set" not in message:
        message += (f"; install it with: pip install tileinfer-backend-{found[1]} (or "
                    f"pip install \"tileinfer-cli[{found[1]}]\")")
    return message
