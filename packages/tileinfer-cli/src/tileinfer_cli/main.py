"""The ``tileinfer`` command. Each subcommand lives in its own module with ``add_parser`` and
``run(args, out) -> exit code``. User mistakes print one clear line and exit with code 2."""

from __future__ import annotations

import argparse
import sys

from . import backends_cmd, bench_cmd, chat_cmd, models_cmd, run_cmd
from .errors import user_errors

COMMANDS = [run_cmd, chat_cmd, models_cmd, backends_cmd, bench_cmd]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tileinfer", description="TileInfer: run LLMs locally.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args, sys.stdout)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except user_errors() as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"tileinfer: error: {message}", file=sys.stderr)
        return 2
