"""The ``tileinfer`` command. Each subcommand lives in its own module with ``add_parser`` and
``run(args, out) -> exit code``. User mistakes print one clear line and exit with code 2.

Startup imports nothing heavy: torch and tileinfer are imported when a command runs, so that
``tileinfer --help`` and ``tileinfer --version`` answer at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import warnings

from . import (backends_cmd, bench_cmd, chat_cmd, embed_cmd, logs_cmd, models_cmd, quantize_cmd,
               run_cmd, show_cmd)
from .cli_words import in_cli_words
from .errors import UserError, first_line, user_errors
from .parsing import HelpFormatter, Parser
from .plugin_errors import failing_op
from .serve import command as serve_cmd  # the server's modules are imported when it runs

COMMANDS = [run_cmd, chat_cmd, embed_cmd, models_cmd, show_cmd, logs_cmd, backends_cmd,
            bench_cmd, quantize_cmd, serve_cmd]

EPILOG = """\
examples:
  tileinfer run "What is the capital of France?"      the embedded SmolLM2-135M-Instruct
  echo "What is the capital of France?" | tileinfer run
  tileinfer pull Qwen/Qwen3-0.6B && tileinfer chat Qwen/Qwen3-0.6B
  tileinfer import model.gguf && tileinfer run -m model "Hi"
  tileinfer list
  tileinfer show SmolLM2-135M-Instruct
  tileinfer embed -m Qwen/Qwen3-Embedding-0.6B "a cat"  one JSON array a line
  tileinfer logs -q Paris                             logged answers and chat turns
  tileinfer backends
  tileinfer bench --shape llama3-8b
  tileinfer quantize --fp8 --calibration t.txt out   GPTQ-rounded FP8 weights
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
    print(f"tileinfer: warning: {in_cli_words(str(message))}", file=sys.stderr)


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
    except BrokenPipeError:
        return _reader_gone()
    except Exception as exc:
        return _failure(exc)


def _failure(exc: Exception) -> int:
    """One line for a user's mistake (exit 2) or a failing backend plugin (exit 1); anything
    else is a bug of TileInfer and keeps its traceback."""
    if isinstance(exc, UserError):  # before user_errors(), which imports tileinfer
        return _report(exc)
    plugin = failing_op(exc)
    if plugin is not None and not os.environ.get("TILEINFER_DEBUG"):
        backend, op = plugin
        print(f"tileinfer: error: backend {backend!r} failed in op {op!r}: "
              f"{type(exc).__name__}: {first_line(exc)} (a bug of that backend; "
              "TILEINFER_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    if plugin is None and isinstance(exc, user_errors()):
        return _report(exc)
    raise exc


def _reader_gone() -> int:
    """The reader of standard output went away (``tileinfer run ... | head -n 1``): end quietly,
    with the exit code of a process that SIGPIPE ended. Standard output is pointed at
    /dev/null so that the interpreter's last flush has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 128 + signal.SIGPIPE


def _report(exc) -> int:
    print(f"tileinfer: error: {in_cli_words(first_line(exc))}", file=sys.stderr)
    return 2
