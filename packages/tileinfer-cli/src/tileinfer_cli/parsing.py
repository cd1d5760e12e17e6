"""argparse pieces shared by the commands: a parser whose errors are one line (exit code 2), a
help formatter that shows defaults and keeps the examples' layout, and range-checked numbers.

Every numeric option is checked here, while the command line is parsed, so that a value out of
range is refused before anything is loaded.
"""

from __future__ import annotations

import argparse
import math
import sys

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors print one line: ``tileinfer run: error: ...``."""

    def error(self, message):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows ``(default: X)`` after each option that has a meaningful default (not None, not a
    flag's False) and leaves the description and epilog (the examples) as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or "default:" in text or default in (None, False, [])
                or default is argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def int_range(lo: int, hi: int):
    """An argparse type: an integer in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{_short(text)} is out of range: use {lo}..{hi}")
        return value

    parse.__name__ = "integer"
    return parse


def float_range(lo: float, hi: float, lo_open: bool = False):
    """An argparse type: a finite number in [lo, hi] (or (lo, hi] with lo_open)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(value) or value > hi or value < lo or (lo_open and value == lo):
            interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise argparse.ArgumentTypeError(f"{_short(text)} is out of range: use a number "
                                             f"in {interval}")
        return value

    parse.__name__ = "number"
    return parse


def logit_bias(text: str) -> dict:
    """An argparse type: a JSON object of token ids (as strings, as the API takes them) to
    biases in [-100, 100], e.g. '{"128001": -100}'."""
    value = _loads_object(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{_short(text)} is not a JSON object of token ids to "
                                         "biases, e.g. '{\"128001\": -100}'")
    out = {}
    for key, bias in value.items():
        if not key.isdigit() or not key.isascii():
            raise argparse.ArgumentTypeError(f"{_short(key)} is not a token id")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) \
                or not -100 <= bias <= 100:
            raise argparse.ArgumentTypeError(f"the bias of token {key} must be a number in "
                                             "[-100, 100]")
        out[int(key)] = float(bias)
    return out


logit_bias.__name__ = "JSON object"


def json_object(text: str) -> dict:
    """An argparse type: a JSON object (checked further where it is used)."""
    value = _loads_object(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{_short(text)} is not a JSON object")
    return value


json_object.__name__ = "JSON object"


def _loads_object(text: str) -> dict | None:
    """text's JSON object, or None when it is not one."""
    import json

    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _short(text: str) -> str:
    return text if len(text) <= 24 else text[:10] + "..." + text[-6:]
