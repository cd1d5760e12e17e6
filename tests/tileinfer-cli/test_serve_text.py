"""The server's per-choice text (``tileinfer_cli.serve.text.ChoiceText``), without a server: the
pieces a stream sends are whole characters, add up to the non-streamed text however the tokens
are grouped, and end before a stop string split across tokens."""

from __future__ import annotations

import pytest

from tileinfer import load_tokenizer
from tileinfer_cli.serve.text import ChoiceText

TEXT = "Grüße aus Köln: 日本語のテキスト 🎉🚀 and ✓ done. The capital of France is Paris."


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return load_tokenizer(smollm2_dir)


def pieces(tok, ids, stops=()):
    text = ChoiceText(tok, list(stops))
    out, stopped = [], False
    for i in ids:
        stopped = text.add(i)
        out.append(text.take())
        if stopped:
            break
    if not stopped:
        stopped = text.end()
        out.append(text.take())
    return out, text.text, stopped


def test_pieces_are_whole_characters_and_add_up(tok):
    ids = tok.encode(TEXT, add_special_tokens=False)
    # Byte-level BPE: the emoji and CJK characters are split over several tokens.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    out, text, stopped = pieces(tok, ids)
    assert "".join(out) == text == TEXT and not stopped
    assert not any("\ufffd" in p for p in out)
    assert any(p == "" for p in out)  # tokens ending inside a character send nothing yet


@pytest.mark.parametrize("stop,before", [("Paris", "The capital of France is "),
                                         ("ital of Fr", "The cap"),
                                         ("🚀 and", "🎉"),
                                         ("e. The", "✓ don")])
def test_a_stop_string_split_across_tokens_ends_the_text_before_it(tok, stop, before):
    ids = tok.encode(TEXT, add_special_tokens=False)
    out, text, stopped = pieces(tok, ids, [stop, "never there"])
    assert stopped
    assert text == TEXT[:TEXT.index(stop)] and text.endswith(before)
    assert "".join(out) == text


def test_a_held_back_prefix_of_a_stop_string_is_released_at_the_end(tok):
    ids = tok.encode("It ends with Par", add_special_tokens=False)
    out, text, stopped = pieces(tok, ids, ["Paris"])
    assert not stopped and text == "It ends with Par" == "".join(out)
    assert out[-1].endswith("Par")  # held back until the end showed it is not "Paris"
