"""The tokenizer: the ``tokenizers`` library on a model's tokenizer.json, plus a streaming printer.

Byte-level BPE (GPT-2, Llama 3, Qwen, Mistral Nemo, SmolLM2) maps every byte to a printable
character, so one token may hold part of a multi-byte UTF-8 character. ``decode_bytes`` returns
the exact bytes of any run of tokens (the pieces of a split character concatenate back to it),
``decode`` turns them into text with U+FFFD only for bytes that are not valid UTF-8, and
``TextStream`` holds back the first half of a split character until the rest arrives.
"""

from __future__ import annotations

import codecs
import re
import sys
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import TextIO

import tokenizers
from tokenizers.decoders import DecodeStream

from .tokenizer_config import special_tokens

LONG_TEXT = 16384  # characters: longer texts are encoded without holding the GIL
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte-fallback tokens


def check_unicode(text: str, what: str = "the text") -> str:
    """text, or a ValueError if it holds a lone surrogate (U+D800..U+DFFF), which no encoding can
    represent: what Python makes of bytes that were not UTF-8 (``errors="surrogateescape"``, as
    for the command line) or of a broken UTF-16 pair."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = ord(text[e.start])
        origin = (f" (the byte 0x{bad - 0xDC00:02x}, which was not UTF-8)"
                  if 0xDC80 <= bad <= 0xDCFF else "")
        raise ValueError(f"{what} is not valid Unicode: a lone surrogate U+{bad:04X} at "
                         f"character {e.start}{origin}") from None
    return text


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: byte -> the printable character that stands for it in tokens.

    Printable Latin-1 bytes stand for themselves; the others (controls, space, 0x7F-0xA0, 0xAD)
    are shifted to U+0100 onwards, in byte order.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


_UNICODE_TO_BYTE = {c: b for b, c in byte_to_unicode().items()}


def _is_byte_level_decoder(backend: tokenizers.Tokenizer) -> bool:
    return isinstance(backend.decoder, tokenizers.decoders.ByteLevel)


class Tokenizer:
    """A model's tokenizer. Token ids are 0-based, as in the vocabulary."""

    def __init__(self, backend: tokenizers.Tokenizer, *, bos_token: str | None = None, eos_token: str | None = None):
        # An inference tokenizer never truncates or pads (some tokenizer.json files switch those on).
        backend.no_truncation()
        backend.no_padding()
        self.backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_token

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return self.token_to_id(self.bos_token) if self.bos_token is not None else None

    @property
    def eos_token_id(self) -> int | None:
        return self.token_to_id(self.eos_token) if self.eos_token is not None else None

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """Ids of the added tokens marked special: what ``skip_special_tokens`` drops."""
        return frozenset(i for i, tok in self.backend.get_added_tokens_decoder().items() if tok.special)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``. Added tokens written in the text (``<|im_end|>``) become their ids.

        ``add_special_tokens`` runs the post-processor (a BOS prefix for Llama 3). A chat prompt
        already holds the BOS its template writes: encode it with ``add_special_tokens=False``.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        check_unicode(text)
        if len(text) > LONG_TEXT:
            # tokenizers' encode holds the GIL throughout, encode_batch lets it go: a server's
            # other threads keep running while a long prompt is encoded. The _fast form tracks
            # no offsets, so it encodes faster and its result is freed without a long pause
            # under the GIL (benchmarks/RESULTS.md, 2026-12-03, "a 4 MB request beside a
            # stream").
            encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
            return encode([text], add_special_tokens=add_special_tokens)[0].ids
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``. Bytes that do not form UTF-8 (a character cut off at the end) become U+FFFD;
        ``decode_bytes`` keeps them exactly."""
        ids = self._check_ids(ids)
        if self._token_bytes is None:
            return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.decode_bytes(ids, skip_special_tokens).decode("utf-8", errors="replace")

    def decode_bytes(self, ids: Iterable[int], skip_special_tokens: bool = False) -> bytes:
        """The exact bytes of ``ids``: ``decode_bytes(a) + decode_bytes(b) == decode_bytes(a + b)`` for
        byte-level tokenizers. Other decoders (SentencePiece-style) go through the library's text decode."""
        ids = self._check_ids(ids)
        if self._token_bytes is None:
            return self.backend.decode(ids, skip_special_tokens=skip_special_tokens).encode("utf-8")
        skip = self.special_ids if skip_special_tokens else frozenset()
        return b"".join(self._token_bytes[i] for i in ids if i not in skip)

    def tail_text(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str | None:
        """The text of the tokens a stream still holds at the end of an answer (each of them
        ends inside a character): a character that the end cut (max_tokens, a stop token) has
        no text and is dropped, while bytes that no continuation could make UTF-8 stay U+FFFD.
        None where the tokens' bytes are unknown: neither byte-level BPE nor byte tokens
        (``<0xE2>``) alone."""
        ids = self._check_ids(ids)
        if self._token_bytes is not None:
            raw = self.decode_bytes(ids, skip_special_tokens)
        else:
            found = [_BYTE_TOKEN.fullmatch(self.id_to_token(i) or "") for i in ids]
            if not all(found):
                return None
            raw = bytes(int(m[1], 16) for m in found)
        # not final: the decoder keeps an unfinished character's bytes to itself
        return codecs.getincrementaldecoder("utf-8")("replace").decode(raw)

    @cached_property
    def _token_bytes(self) -> list[bytes] | None:
        """Bytes of every token id for a byte-level decoder, else None.

        Same rule as the library's ByteLevel decoder: a token all of whose characters are in the
        byte alphabet stands for those bytes; any other token (an added token such as ``<|a b|>``)
        stands for its own UTF-8 text.
        """
        if not _is_byte_level_decoder(self.backend):
            return None
        vocab = self.backend.get_vocab(with_added_tokens=True)
        table = [b""] * max(self.vocab_size, max(vocab.values(), default=-1) + 1)
        for token, i in vocab.items():
            try:
                table[i] = bytes(_UNICODE_TO_BYTE[c] for c in token)
            except KeyError:
                table[i] = token.encode("utf-8")
        return table

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        return ids


def load_tokenizer(model_dir: str | Path) -> Tokenizer:
    """The tokenizer of a model folder: tokenizer.json, with BOS/EOS named by tokenizer_config.json
    (or special_tokens_map.json)."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {model_dir}")
    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises a bare Exception on a malformed file
        raise ValueError(f"cannot read {path}: {e}") from e
    named = special_tokens(model_dir)
    return Tokenizer(backend, bos_token=named.get("bos_token"), eos_token=named.get("eos_token"))


class TextStream:
    """Prints generated tokens to ``file`` as they arrive: ``put(id)`` per token, ``end()`` after the last.

    A token that ends inside a multi-byte character prints nothing until the character is
    complete (the library's ``DecodeStream`` does the holding back); ``end()`` prints whatever is
    still held (``Tokenizer.tail_text``: a character the end cut is dropped, not U+FFFD).
    ``put`` can be passed as a generation's ``on_token`` callback.
    """

    def __init__(self, tokenizer: Tokenizer, file: TextIO | None = None, *, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.file = file if file is not None else sys.stdout
        self.skip_special_tokens = skip_special_tokens
        self._reset()

    def _reset(self) -> None:
        self._stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
        self._ids: list[int] = []
        self._printed: list[str] = []
        self._held = 0  # tokens put since the last printed chunk

    @property
    def text(self) -> str:
        """Everything printed since the last ``end()``."""
        return "".join(self._printed)

    def put(self, token_id: int) -> str:
        """Add one token; print and return the text it completes (maybe "")."""
        token_id = int(token_id)
        if not 0 <= token_id < self.tokenizer.vocab_size:
            raise ValueError(f"token id {token_id} out of range [0, {self.tokenizer.vocab_size})")
        self._ids.append(token_id)
        chunk = self._stream.step(self.tokenizer.backend, token_id)
        if chunk is None:
            self._held += 1
            return ""
        self._held = 0
        return self._write(chunk)

    def end(self) -> str:
        """Print what is held back, then start afresh. Returns the text printed now."""
        tail = ""
        if self._held:
            held = self._ids[len(self._ids) - self._held :]
            tail = self.tokenizer.tail_text(held, self.skip_special_tokens)
            if tail is None:  # bytes unknown: the whole text's tail past what was printed
                full = self.tokenizer.decode(self._ids, skip_special_tokens=self.skip_special_tokens)
                printed = self.text
                if full.startswith(printed):
                    tail = full[len(printed) :]
                else:  # the decoder rewrote earlier text (not seen in practice): the held tokens alone
                    tail = self.tokenizer.decode(held, skip_special_tokens=self.skip_special_tokens)
            self._write(tail)
        self._reset()
        return tail

    def _write(self, chunk: str) -> str:
        if chunk:
            self._printed.append(chunk)
            self.file.write(chunk)
            self.file.flush()
        return chunk
