"""Text from the command line, standard input and files, checked to be valid Unicode.

Python turns bytes of the command line that are not UTF-8 into lone surrogates
(U+DC80..U+DCFF, PEP 383); the tokenizer cannot encode those. They are refused here with one line
that says which byte and where, before anything is loaded.
"""

from __future__ import annotations

import sys

from .errors import UserError


def checked_text(text: str, what: str) -> str:
    """text, or a UserError if it holds lone surrogates (bytes that were not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start]
        if "\udc80" <= bad <= "\udcff":
            detail = f"byte 0x{ord(bad) - 0xDC00:02x} at character {e.start + 1}"
        else:
            detail = f"lone surrogate U+{ord(bad):04X} at character {e.start + 1}"
        raise UserError(f"{what} is not valid UTF-8 text ({detail})") from None
    return text


def decoded(data: bytes, what: str) -> str:
    """UTF-8 bytes as text, or a UserError naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} is not valid UTF-8 text (byte 0x{data[e.start]:02x} at byte "
                        f"offset {e.start})") from None


def read_stdin(what: str = "standard input") -> str:
    return decoded(sys.stdin.buffer.read(), what)


def read_file(path: str) -> str:
    if path == "-":
        return read_stdin()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"cannot read the prompt file {path}: {e.strerror or e}") from None
    return decoded(data, f"the prompt file {path}")


def stdin_is_terminal() -> bool:
    try:
        return sys.stdin is None or sys.stdin.isatty()
    except (AttributeError, ValueError):
        return True
