"""The tokenizer and the stream printer, on SmolLM2's byte-level BPE (imported from its GGUF),
checked against the tokenizers library and transformers."""

import io
import json

import pytest
import tokenizers
from tokenizers import AddedToken, processors
from transformers import AutoTokenizer

from tileinfer.io.tokenizer import TextStream, Tokenizer, load_tokenizer

TEXTS = [
    "Hello world",
    "Café naïve Grüße — “quotes”",
    "Emoji: 😀👍🏽🇨🇭 ❤️",
    "日本語のテキスト、中文，한국어",
    'def f(x):\n    return {"a": x ** 2}\n',
    "<|im_start|>user\nHi<|im_end|>\n",
    " spaces   and\ttabs ",
]


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def hf(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


def split_character_ids(tok):
    """Token ids of a text in which some token ends inside a multi-byte character."""
    for text in ("😀", "🇨🇭", "你好吗", "ḁḃḉ", "𝔘𝔫𝔦"):
        ids = tok.encode(text, add_special_tokens=False)
        for i in range(1, len(ids)):
            try:
                tok.decode_bytes(ids[:i]).decode("utf-8")
            except UnicodeDecodeError:
                return text, ids, i
    pytest.fail("no text with a token boundary inside a character")


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_the_library_and_transformers(tok, hf, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text == tok.backend.decode(ids, skip_special_tokens=False) == hf.decode(ids)
    for skip in (False, True):
        assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)


def test_added_tokens_in_text_become_their_ids(tok):
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == tok.token_to_id("<|im_start|>") == 1 and ids[-1] == tok.eos_token_id == 2
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHi"


def test_a_long_text_encodes_as_a_short_one_does(tok):
    """Texts over LONG_TEXT characters take the library's batch form (without the GIL, without
    offsets): the same ids as its plain encode, added tokens and multi-byte characters included."""
    from tileinfer.io.tokenizer import LONG_TEXT

    text = ("Olá, <|im_end|> naïve café 東京 🙂 " * (LONG_TEXT // 20))[:LONG_TEXT + 999]
    assert len(text) > LONG_TEXT
    for special in (True, False):
        assert tok.encode(text, add_special_tokens=special) == \
            tok.backend.encode(text, add_special_tokens=special).ids


def test_bos_and_eos(tok):
    assert (tok.bos_token, tok.eos_token, tok.bos_token_id, tok.eos_token_id) == ("<|im_start|>", "<|im_end|>", 1, 2)


def test_split_character_keeps_its_bytes(tok):
    text, ids, cut = split_character_ids(tok)
    head, tail = tok.decode_bytes(ids[:cut]), tok.decode_bytes(ids[cut:])
    assert head + tail == text.encode("utf-8")
    # Text decoding replaces only the incomplete bytes, as the library does.
    assert tok.decode(ids[:cut]) == tok.backend.decode(ids[:cut], skip_special_tokens=False)
    assert tok.decode(ids[:cut]).endswith("\ufffd")
    assert tok.decode(ids) == text


def test_added_token_outside_the_byte_alphabet_decodes_as_the_library_does(smollm2_dir):
    # The byte-level decoder maps a token's characters to bytes only when all of them are in the
    # byte alphabet; "<|a b|>" has a plain space, which is not.
    backend = tokenizers.Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    backend.add_tokens([AddedToken("<|a b|>", normalized=False), AddedToken("ĠĠ", normalized=False)])
    tok = Tokenizer(backend)
    ids = tok.encode("x <|a b|> y ĠĠ z")
    assert tok.decode(ids) == backend.decode(ids, skip_special_tokens=False)


def test_add_special_tokens_runs_the_post_processor(smollm2_dir, tmp_path):
    # A Llama-3-like folder: the post-processor prefixes BOS.
    backend = tokenizers.Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    backend.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", pair="<|im_start|> $A <|im_start|> $B", special_tokens=[("<|im_start|>", 1)]
    )
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok, hf = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert tok.encode(text) == hf.encode(text) and tok.encode(text)[0] == 1
        assert tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
    assert tok.bos_token == "<|im_start|>"


def test_truncation_in_tokenizer_json_is_ignored(smollm2_dir, tmp_path):
    backend = tokenizers.Tokenizer.from_file(str(smollm2_dir / "tokenizer.json"))
    backend.enable_truncation(max_length=4)
    backend.save(str(tmp_path / "tokenizer.json"))
    assert len(load_tokenizer(tmp_path).encode("one two three four five six seven")) == 7


def test_stream_prints_complete_characters_only(tok):
    text = "Grüße 😀 aus 日本 🇨🇭!"
    ids = tok.encode(text, add_special_tokens=False)
    out = io.StringIO()
    stream = TextStream(tok, out)
    for i in ids:
        stream.put(i)
        printed = out.getvalue()
        assert "\ufffd" not in printed
        assert text.startswith(printed)
    stream.end()
    assert out.getvalue() == text


def test_stream_holds_back_a_split_character(tok):
    text, ids, cut = split_character_ids(tok)
    out = io.StringIO()
    stream = TextStream(tok, out)
    for i in ids[:cut]:
        stream.put(i)
    held = out.getvalue()
    assert held == tok.decode(ids[:cut]).rstrip("\ufffd")  # the partial character is not printed
    for i in ids[cut:]:
        stream.put(i)
    assert out.getvalue() == text
    assert stream.end() == ""


def test_stream_end_drops_a_character_the_end_cut(tok):
    """A character cut by the end of the answer has no text: end() prints the text before it
    (decode, which converts whatever it is given, shows it as U+FFFD)."""
    text, ids, cut = split_character_ids(tok)
    out = io.StringIO()
    stream = TextStream(tok, out)
    for i in ids[:cut]:
        stream.put(i)
    stream.end()
    assert out.getvalue() == tok.decode(ids[:cut]).rstrip("\ufffd")
    assert text.startswith(out.getvalue())
    # end() starts afresh: the stream can print the next reply.
    for i in tok.encode("ok", add_special_tokens=False):
        stream.put(i)
    stream.end()
    assert out.getvalue().endswith("ok")


def test_stream_end_keeps_bytes_that_are_no_utf8_as_replacement(tok):
    """A lone continuation byte can start no character: it stays U+FFFD, the cut character after
    it goes."""
    from tileinfer.io.tokenizer import byte_to_unicode

    stray = tok.token_to_id(byte_to_unicode()[0x80])
    _, ids, cut = split_character_ids(tok)
    out = io.StringIO()
    stream = TextStream(tok, out)
    for i in [*tok.encode("a", add_special_tokens=False), stray, *ids[:cut]]:
        stream.put(i)
    stream.end()
    assert out.getvalue() == "a\ufffd" + tok.decode(ids[:cut]).rstrip("\ufffd")


def test_stream_can_skip_special_tokens(tok):
    out = io.StringIO()
    stream = TextStream(tok, out, skip_special_tokens=True)
    for i in tok.encode("Hi there<|im_end|>"):
        stream.put(i)
    stream.end()
    assert out.getvalue() == "Hi there"


def test_sentencepiece_style_decoder_goes_through_the_library():
    # A byte-fallback vocabulary with a Metaspace decoder (Llama 2 / Mistral 7B style).
    vocab = {"<unk>": 0, "▁Hi": 1, "▁there": 2, "▁": 3, **{f"<0x{b:02X}>": 4 + b for b in range(256)}}
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace()
    backend.decoder = tokenizers.decoders.Sequence(
        [tokenizers.decoders.Replace("▁", " "), tokenizers.decoders.ByteFallback(), tokenizers.decoders.Fuse(), tokenizers.decoders.Strip(" ", 1, 0)]
    )
    tok = Tokenizer(backend)
    ids = tok.encode("Hi there é")
    assert tok.token_to_id("<0xC3>") in ids  # é spelled as its two bytes
    assert tok.decode(ids) == backend.decode(ids, skip_special_tokens=False) == "Hi there é"
    out = io.StringIO()
    stream = TextStream(tok, out)
    for i in ids:
        stream.put(i)
        assert "\ufffd" not in out.getvalue()
    stream.end()
    assert out.getvalue() == "Hi there é"


def test_bad_ids_and_files(tok, tmp_path):
    with pytest.raises(ValueError, match="out of range"):
        tok.decode([1, tok.vocab_size])
    with pytest.raises(ValueError, match="out of range"):
        TextStream(tok, io.StringIO()).put(-1)
    with pytest.raises(TypeError, match="takes a str"):
        tok.encode(b"bytes")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ValueError, match="cannot read"):
        load_tokenizer(tmp_path)


def test_text_that_is_not_valid_unicode_is_one_clear_error(tok):
    # A lone surrogate (bytes of a command line that were not UTF-8, or half a UTF-16 pair)
    # ended in the library's "TextInputSequence must be str".
    with pytest.raises(ValueError, match=r"not valid Unicode: a lone surrogate U\+DC80"):
        tok.encode("ok \udc80")
    with pytest.raises(ValueError, match=r"U\+DFFF at character 1$"):
        tok.encode("a\udfff", add_special_tokens=False)
