"""The ``tileinfer`` command. Each subcommand lives in its own module with ``add_parser`` and
``run(args, out) -> exit code``. User mistakes print one clear line and exit non-zero."""

from __future__ import annotations

import argparse
import sys

from . import backends_cmd

COMMANDS = [backends_cmd]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tileinfer", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


class UserError(Exception):
    """A mistake of the user's: printed as one line, exit code 2."""


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args, sys.stdout)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UserError as exc:
        print(f"tileinfer: error: {exc}", file=sys.stderr)
        return 2
