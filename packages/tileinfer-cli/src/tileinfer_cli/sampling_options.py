"""The sampling options by the names of the OpenAI-style server (temperature, top_p, top_k, seed,
max_tokens, presence_penalty, frequency_penalty, repetition_penalty, min_p, logit_bias):
``-o KEY VALUE`` on run and chat, and ``/set KEY VALUE`` inside a chat. Each maps to the
attribute of the parsed arguments that its command-line flag sets, and is checked with the same
range as that flag."""

from __future__ import annotations

import argparse

from .errors import UserError
from .parsing import INT32_MAX, INT64_MAX, float_range, int_range, logit_bias

# name -> (the argparse attribute, the flag, parse-and-check)
OPTIONS = {
    "temperature": ("temperature", "--temperature", float_range(0, 1e6)),
    "top_p": ("top_p", "--top-p", float_range(0, 1, lo_open=True)),
    "top_k": ("top_k", "--top-k", int_range(0, INT32_MAX)),
    "seed": ("seed", "--seed", int_range(0, INT64_MAX // 2)),
    "max_tokens": ("max_new_tokens", "--max-new-tokens", int_range(1, INT32_MAX)),
    "presence_penalty": ("presence_penalty", "--presence-penalty", float_range(-2, 2)),
    "frequency_penalty": ("frequency_penalty", "--frequency-penalty", float_range(-2, 2)),
    "repetition_penalty": ("repetition_penalty", "--repetition-penalty",
                           float_range(0, 1e6, lo_open=True)),
    "min_p": ("min_p", "--min-p", float_range(0, 1)),
    "logit_bias": ("logit_bias", "--logit-bias", logit_bias),
}
# The options that are SamplingParams fields of the same name (the others: seed, max_tokens).
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty",
                   "repetition_penalty", "min_p", "logit_bias")
KNOWN = ", ".join(OPTIONS)


def parsed(key: str, value: str) -> tuple[str, object]:
    """(argparse attribute, checked value) of the option ``key``; a UserError naming the known
    options for an unknown key, or the range for a value out of it."""
    name = key.strip().lower().replace("-", "_")
    if name not in OPTIONS:
        raise UserError(f"unknown option {key!r}; the options are {KNOWN}")
    attr, _, parse = OPTIONS[name]
    try:
        return attr, parse(value)
    except argparse.ArgumentTypeError as e:
        raise UserError(f"{name}: {e}") from None


class OptionAction(argparse.Action):
    """``-o KEY VALUE`` (repeatable): sets what the option's own flag would set, checked while
    the command line is parsed; a later one of the same key wins, as a repeated flag does."""

    def __call__(self, parser, namespace, values, option_string=None):
        key, value = values
        try:
            attr, checked = parsed(key, value)
        except UserError as e:
            raise argparse.ArgumentError(self, str(e)) from None
        setattr(namespace, attr, checked)


def add_option_flag(group):
    group.add_argument("--option", "-o", nargs=2, action=OptionAction, metavar=("KEY", "VALUE"),
                       help=f"a sampling option by its API name ({KNOWN}); repeatable")
