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


def test_a_file_and_a_pipe_are_joined_as_an_argument_and_a_pipe_are(monkeypatch, tmp_path):
    # Before: `cat notes.txt | tileinfer run -f question.txt` dropped the notes without a word.
    (tmp_path / "q.txt").write_text("from the file\n")
    monkeypatch.setattr("sys.stdin", Piped(b"piped\n"))
    assert prompt_and_model(words(file=str(tmp_path / "q.txt")))[0] == "piped\n\nfrom the file"
    monkeypatch.setattr("sys.stdin", Piped(b""))
    assert prompt_and_model(words(file=str(tmp_path / "q.txt")))[0] == "from the file"


def test_a_lone_word_that_names_a_model_here_is_the_model(monkeypatch, tmp_path):
    """`echo PROMPT | tileinfer run MODEL`, as with ollama: a word that names the default
    model, an imported model or a model folder; any other word stays the prompt."""
    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path / "home"))
    imported = tmp_path / "home" / "models" / "mysmol"
    imported.mkdir(parents=True)
    (imported / "config.json").write_text("{}")
    for model in ("SmolLM2-135M-Instruct", "mysmol", str(imported)):
        monkeypatch.setattr("sys.stdin", Piped(b"What is the capital of France?\n"))
        assert prompt_and_model(words(model)) == ("What is the capital of France?", model)
    monkeypatch.setattr("sys.stdin", Piped(b"notes\n"))
    assert prompt_and_model(words("Summarize")) == ("notes\n\nSummarize", None)
    monkeypatch.setattr("sys.stdin", Piped(b"", tty=True))  # a terminal: the word is the prompt
    assert prompt_and_model(words("mysmol")) == ("mysmol", None)


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
