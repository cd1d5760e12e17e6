"""The server's per-choice text (``tileinfer_cli.serve.text.ChoiceText``), without a server: the
pieces a stream sends are whole characters, add up to the non-streamed text however the tokens
are grouped, and end before a stop string split across tokens."""

from __future__ import annotations

import pytest

from tileinfer import load_tokenizer
from tileinfer.io.tokenizer import byte_to_unicode
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


# -- an answer that ends inside a character ------------------------------------------------------

CUT_TEXT = "Prost 🎉🚀 日本"  # the emoji and CJK characters take several tokens each


def byte_token(tok, byte: int) -> int:
    """The id of the byte-level token that stands for one byte."""
    return tok.token_to_id(byte_to_unicode()[byte])


def test_a_character_cut_at_the_end_is_dropped_not_shown_as_fffd(tok):
    """max_tokens ends the answer inside a multi-byte character: the text is every whole
    character before it (streamed and not), with no U+FFFD for the bytes that never completed."""
    ids = tok.encode(CUT_TEXT, add_special_tokens=False)
    cuts = [k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd")]
    assert cuts  # the tokenizer does split these characters
    for k in cuts:
        whole_bytes = tok.decode_bytes(ids[:k])
        expected = whole_bytes.decode("utf-8", errors="ignore")  # the whole characters
        assert CUT_TEXT.startswith(expected) and "\ufffd" not in expected
        out, text, stopped = pieces(tok, ids[:k])
        assert text == "".join(out) == expected and not stopped, (k, out)


def test_bytes_that_are_no_utf8_stay_fffd_and_only_the_unfinished_end_goes(tok):
    """A lone continuation byte (0x80) is not UTF-8 wherever it stands: it shows as U+FFFD, in
    the middle or in the held tail; the unfinished start of a euro sign (E2 82) at the end
    does not show."""
    a, b = (tok.encode(s, add_special_tokens=False) for s in ("A", "B"))
    lone, euro = byte_token(tok, 0x80), [byte_token(tok, 0xE2), byte_token(tok, 0x82)]
    for ids, expected in [(a + [lone] + b + euro, "A\ufffdB"),
                          (a + [lone] + euro, "A\ufffd"),
                          (a + euro + b, "A\ufffdB"),  # E2 82 then B: not UTF-8 either
                          (a + euro + [byte_token(tok, 0xAC)], "A€"),
                          (tok.encode("x\ufffd", add_special_tokens=False), "x\ufffd")]:
        out, text, _ = pieces(tok, ids)
        assert text == "".join(out) == expected, (ids, out)


def test_a_byte_fallback_tokenizer_drops_its_cut_character_too():
    """SentencePiece's byte tokens (Llama 2, Mistral 7B, GGUF imports): a euro sign's bytes cut
    after two of three leave no U+FFFD; a lone continuation byte still shows one."""
    import tokenizers

    from tileinfer.io.tokenizer import Tokenizer

    vocab = {"<unk>": 0, "▁Hi": 1, "▁": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [], unk_token="<unk>",
                                                         byte_fallback=True))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    backend.decoder = tokenizers.decoders.Sequence(
        [tokenizers.decoders.Replace("▁", " "), tokenizers.decoders.ByteFallback(),
         tokenizers.decoders.Fuse(), tokenizers.decoders.Strip(" ", 1, 0)])
    tok = Tokenizer(backend)
    ids = tok.encode("Hi €")
    assert ids[-3:] == [3 + 0xE2, 3 + 0x82, 3 + 0xAC]  # the euro sign as its three bytes
    for cut, expected in [(ids, "Hi €"), (ids[:-1], "Hi "), (ids[:-2], "Hi "),
                          (ids[:-3] + [3 + 0x80], "Hi \ufffd")]:
        out, text, _ = pieces(tok, cut)
        assert text == "".join(out) == expected, (cut, out)

@pytest.fixture(scope="module")
def scripted(smollm2_dir, tmp_path_factory):
    """The server with the scripted engine of ``serve_scripted.py`` (the real detokenizing,
    chunks and formats) on SmolLM2's tokenizer and chat template."""
    for module in ("starlette", "uvicorn", "pydantic", "prometheus_client", "openai"):
        pytest.importorskip(module)
    import openai

    from serve_scripted import scripted_server, stop
    from test_serve_helpers import tiny_folder

    folder = tiny_folder(smollm2_dir, tmp_path_factory.mktemp("serve-text"))
    server, url, engine = scripted_server(folder)
    try:
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=60,
                            max_retries=0), engine
    finally:
        stop(server)


def test_a_served_answer_cut_inside_a_character_ends_before_it(scripted):
    """Through the server, whole and streamed, chat and completions: max_tokens ends the
    answer inside 🚀; the text ends with the 🎉 before it, finish reason "length"."""
    client, engine = scripted
    engine.script = CUT_TEXT
    ids = engine.tokenizer.encode(CUT_TEXT, add_special_tokens=False)
    k = next(k for k in range(len(ids)) if engine.tokenizer.decode(ids[:k]).endswith("🎉\ufffd"))
    expected = "Prost 🎉"
    ask = dict(model="tiny-smollm2-shape", max_tokens=k)
    messages = [{"role": "user", "content": "Hallo"}]
    choice = client.chat.completions.create(messages=messages, **ask).choices[0]
    assert (choice.message.content, choice.finish_reason) == (expected, "length")
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **ask))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "length"
    choice = client.completions.create(prompt="Hallo", **ask).choices[0]
    assert (choice.text, choice.finish_reason) == (expected, "length")
    streamed = list(client.completions.create(prompt="Hallo", stream=True, **ask))
    assert "".join(c.choices[0].text for c in streamed) == expected
