"""Reading the user's turns in ``tileinfer chat``.

On a terminal, prompt_toolkit edits the line (arrow keys, Home/End, Ctrl-R search) and keeps a
history file under TileInfer's home; text pasted in one go (bracketed paste) is one turn, newlines
and all. Piped in, each line is a turn and no prompt is written. Either way a turn that starts
with ``\"\"\"`` runs until a line that ends with ``\"\"\"``, as in ollama.
"""

from __future__ import annotations

import re
import sys
import warnings

from .errors import UserError
from .text_input import decoded

PROMPT, MORE = ">>> ", "... "
FENCE = '"""'
# What a terminal sends for keys that are not text (arrows: ESC [ A); dropped from piped lines.
_ESCAPES = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|O[A-Za-z]|[@-Z\\-_])")


def read_turn(read_line) -> str:
    """One turn from ``read_line(prompt) -> str`` (EOFError at the end): a line, or the lines of
    a \"\"\" block without the fences; a UserError when the input ends inside a block (its text
    is not sent: half a message would be answered as if it were whole)."""
    first = read_line(PROMPT)
    if not first.lstrip().startswith(FENCE):
        return first
    text = first.lstrip()[len(FENCE):]
    lines = []
    while True:
        if text.rstrip().endswith(FENCE):
            lines.append(text.rstrip()[:-len(FENCE)])
            return "\n".join(lines).strip("\n")
        lines.append(text)
        try:
            text = read_line(MORE)
        except EOFError:
            raise UserError(f'the input ended inside a {FENCE} block (no closing {FENCE}); '
                            "its message was not sent") from None


class PipedInput:
    """Lines of a binary stream, decoded as UTF-8 (a UserError for a line that is not), with
    terminal escape sequences dropped; no prompt is written. ``lines``: how many were read."""

    def __init__(self, stream):
        self.stream = stream
        self.lines = 0

    def read_line(self, prompt: str) -> str:
        line = self.stream.readline()
        if not line:
            raise EOFError
        self.lines += 1
        return _ESCAPES.sub("", decoded(line, "the line").rstrip("\r\n"))


class TerminalInput:
    """prompt_toolkit's line editor with a history file (or none, if it cannot be written)."""

    def __init__(self, history_path=None, input=None, output=None):
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import InMemoryHistory

        history = _FileHistory(history_path) if history_path is not None else InMemoryHistory()
        self.session = PromptSession(history=history, input=input, output=output,
                                     enable_history_search=False)

    def read_line(self, prompt: str) -> str:
        return self.session.prompt(prompt)


def _FileHistory(path):
    from prompt_toolkit.history import FileHistory

    class QuietFileHistory(FileHistory):
        """A history file that a full disk or a read-only home only warns about, once."""

        warned = False

        def load_history_strings(self):
            try:
                yield from super().load_history_strings()
            except (OSError, ValueError):
                return

        def store_string(self, string):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                super().store_string(string)
            except OSError as e:
                if not self.warned:
                    self.warned = True
                    warnings.warn(f"the chat history cannot be saved in {path}: "
                                  f"{e.strerror or e}")

    return QuietFileHistory(str(path))


def history_path():
    """TileInfer's home / chat_history, or None when the home is not usable."""
    from tileinfer.io.paths import HomeError, tileinfer_home

    try:
        return tileinfer_home() / "chat_history"
    except HomeError:
        return None


def is_terminal(stream) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        return False


def open_input():
    """(reader, stream to write prompts and notes for the person at the keyboard, or None).

    On a terminal the prompts go to standard output, or to standard error when standard output
    is redirected (``tileinfer chat > answers.txt``), so the saved answers hold no prompts."""
    if not is_terminal(sys.stdin):
        return PipedInput(sys.stdin.buffer), None
    if is_terminal(sys.stdout):
        return TerminalInput(history_path()), sys.stdout
    from prompt_toolkit.output import create_output

    return TerminalInput(history_path(), output=create_output(stdout=sys.stderr)), sys.stderr
