"""The ``tileinfer`` command. Each subcommand lives in its own module with ``add_parser`` and
``run(args, out) -> exit code``. User mistakes print one clear line and exit with code 2.

Startup imports nothing heavy: torch and tileinfer are imported when a command runs, so that
``tileinfer --help`` and ``tileinfer --version`` answer at once.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import warnings

from . import backends_cmd, bench_cmd, chat_cmd, models_cmd, run_cmd
from .errors import UserError, user_errors
from .parsing import HelpFormatter, Parser
from .serve import command as serve_cmd  # the server's modules are imported when it runs

COMMANDS = [run_cmd, chat_cmd, models_cmd, backends_cmd, bench_cmd, serve_cmd]

EPILOG = """\
examples:
  tileinfer run "What is the capital of France?"      the embedded SmolLM2-135M-Instruct
  echo "What is the capital of France?" | tileinfer run
  tileinfer pull Qwen/Qwen3-0.6B && tileinfer chat Qwen/Qwen3-0.6B
  tileinfer import model.gguf && tileinfer run -m model "Hi"
  tileinfer list
  tileinfer backends
  tileinfer bench --shape llama3-8b
  tileinfer serve                                     an OpenAI-compatible server on :8000

`tileinfer COMMAND --help` shows a command's options and examples.
"""


class _Version(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from .version import version_text

        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tileinfer", description="TileInfer: run LLMs locally.", epilog=EPILOG,
                    formatter_class=HelpFormatter)
    parser.add_argument("--version", "-V", action=_Version,
                        help="show the installed TileInfer distributions and backends")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub, HelpFormatter)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"tileinfer: warning: {message}", file=sys.stderr)


def _terminate(signum, frame):
    # SIGTERM ends the command like Ctrl-C would, so that cleanups run (an import's staging
    # folder is removed, a chat turn rolled back).
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    warnings.showwarning = _show_warning
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args, sys.stdout)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except UserError as exc:  # before user_errors(), which imports tileinfer
        return _report(exc)
    except user_errors() as exc:
        return _report(exc)


def _report(exc) -> int:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"tileinfer: error: {message}", file=sys.stderr)
    return 2
