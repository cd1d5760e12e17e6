"""``tileinfer run --speculative ngram`` answers as plain decoding does (greedy, the embedded SmolLM2
on the ref backend), plain decoding (``--speculative none``) is the default, and ``--draft-k``
without speculation is one clear error."""

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
def test_ngram_answers_as_plain_decoding_which_is_the_default(home, prompt):
    spec, spec_err = _run(home, "--speculative", "ngram", prompt)
    plain, plain_err = _run(home, prompt)
    assert spec["tokens"] == plain["tokens"] and spec["text"] == plain["text"]
    assert "speculative:" in spec_err  # it ran the speculative loop
    assert "speculative:" not in plain_err


def test_draft_k_without_speculation_is_one_line():
    assert_one_line_error(tileinfer("run", "hi", "--speculative", "none", "--draft-k", "3"),
                          r"--draft-k needs speculative decoding \(not --speculative none\)")


def test_unknown_speculative_kind_is_one_line():
    assert_one_line_error(tileinfer("run", "hi", "--speculative", "ngrams"),
                          "--speculative: 'ngrams': use ngram, none, draft:MODEL or dflash:MODEL")
