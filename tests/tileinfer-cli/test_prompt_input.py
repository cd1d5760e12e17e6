"""Where ``tileinfer run`` takes its prompt from: the argument, standard input, both (piped text
first, a blank line, then the argument, as simonw's llm does), ``-`` and ``--file``."""

import argparse
import io
import json

import pytest

from cli_helpers import tileinfer
from tileinfer_cli.run_cmd import prompt_and_model


class Piped:
    """A stand-in for sys.stdin that is a pipe holding ``data``."""

    def __init__(self, data: bytes, tty=False):
        self.buffer = io.BytesIO(data)
        self.tty = tty

    def isatty(self):
        return self.tty


def words(*w, file=None, model=None):
    return argparse.Namespace(words=list(w), file=file, model=model)


@pytest.mark.parametrize("piped,args,expected", [
    (b"line one\nline two\n", ("Summarize",), "line one\nline two\n\nSummarize"),
    (b"", ("Summarize",), "Summarize"),            # nothing piped: the argument alone
    (b" \n\n", ("Summarize",), "Summarize"),
    (b"the notes\n", ("-",), "the notes"),         # "-": standard input only
    (b"the notes\n", (), "the notes"),
    (b"notes\n", ("my-model", "Summarize"), "notes\n\nSummarize"),
])
def test_piped_text_and_argument_are_joined(monkeypatch, piped, args, expected):
    # Before: `cat notes.txt | tileinfer run "Summarize"` dropped the notes without a word.
    monkeypatch.setattr("sys.stdin", Piped(piped))
    prompt, model = prompt_and_model(words(*args))
    assert prompt == expected
    assert model == ("my-model" if len(args) == 2 else None)


def test_a_terminal_on_stdin_is_not_read(monkeypatch):
    monkeypatch.setattr("sys.stdin", Piped(b"must not be read", tty=True))
    assert prompt_and_model(words("Summarize"))[0] == "Summarize"


def test_file_keeps_its_meaning_beside_a_pipe(monkeypatch, tmp_path):
    (tmp_path / "q.txt").write_text("from the file\n")
    monkeypatch.setattr("sys.stdin", Piped(b"piped"))
    assert prompt_and_model(words(file=str(tmp_path / "q.txt")))[0] == "from the file"


def test_the_joined_prompt_reaches_the_model(tiny_home):
    def answer(*args, stdin=None):
        result = tileinfer("run", "-m", "tiny", "--json", "-n", "4", *args, stdin=stdin,
                           env=tiny_home)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    piped = answer("the thin", stdin="then the\n")
    spelled_out = answer("then the\n\nthe thin")
    alone = answer("the thin")
    assert piped["prompt_tokens"] == spelled_out["prompt_tokens"] > alone["prompt_tokens"]
    assert piped["tokens"] == spelled_out["tokens"]
