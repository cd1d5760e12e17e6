"""n-gram speculation is the default of ``tileinfer run`` and ``tileinfer chat``: the answer is the
one plain decoding gives (greedy, the embedded SmolLM2 on the ref backend), ``--speculative none``
turns it off, and ``--draft-k`` without speculation is one clear error."""

from __future__ import annotations

import json

import pytest

from test_issue20_cli import QUESTION, assert_one_line_error, home, tileinfer  # noqa: F401

REPEAT = "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat."


def _run(home, *args):
    result = tileinfer("run", "--json", "--stats", "-t", "0", "-n", "24", *args, env=home)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("prompt", [QUESTION, REPEAT], ids=["question", "repeat"])
def test_run_speculates_by_default_and_answers_as_plain_decoding(home, prompt):
    default, default_err = _run(home, prompt)
    plain, plain_err = _run(home, "--speculative", "none", prompt)
    assert default["tokens"] == plain["tokens"] and default["text"] == plain["text"]
    assert "speculative:" in default_err  # the default ran the speculative loop
    assert "speculative:" not in plain_err


def test_draft_k_without_speculation_is_one_line():
    assert_one_line_error(tileinfer("run", "hi", "--speculative", "none", "--draft-k", "3"),
                          r"--draft-k needs speculative decoding \(not --speculative none\)")


def test_unknown_speculative_kind_is_one_line():
    assert_one_line_error(tileinfer("run", "hi", "--speculative", "ngrams"),
                          "--speculative: 'ngrams': use ngram, none, draft:MODEL or dflash:MODEL")
