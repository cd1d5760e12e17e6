"""A choice's text, built token by token: what ``tileinfer run`` prints, as pieces to send.

Decoding is incremental, as ``tileinfer.TextStream`` does it (``tokenizers``' ``DecodeStream``,
which holds back a token that ends inside a multi-byte character until the character
completes), written out here to skip TextStream's per-token checks on the server's hot path.
At the end, what is still held is decoded from its bytes (``Tokenizer.tail_text``): a
character that the end of the answer cut (max_tokens, a stop token) has no text, so it is
dropped rather than shown as U+FFFD, while bytes that are not UTF-8 at all still are.
``StopWriter``
(the CLI's ``--stop``) then holds back any tail that could start a stop string and ends the
text before the first one found. So every piece ``take()`` returns is whole characters, and the
pieces add up to exactly the text of a non-streamed answer, however the tokens were grouped
into steps.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from ..stops import StopStringFound, StopWriter


class _Sink:
    """The file StopWriter writes to: collects the pieces until ``take``."""

    __slots__ = ("parts",)

    def __init__(self):
        self.parts: list[str] = []

    def write(self, text: str):
        self.parts.append(text)

    def flush(self):
        pass


class ChoiceText:
    def __init__(self, tokenizer, stops: list[str]):
        self._tokenizer, self._backend = tokenizer, tokenizer.backend
        self._decoder = DecodeStream(skip_special_tokens=False)
        self._sink = _Sink()
        self._writer = StopWriter(stops, self._sink) if stops else None
        self._write = self._writer.write if stops else self._sink.parts.append
        self._vocab = tokenizer.vocab_size
        self._ids: list[int] = []
        self._decoded: list[str] = []  # what the decoder gave, before stop strings
        self._held = 0  # tokens since the decoder last gave text

    def add(self, token: int) -> bool:
        """Decode one more token; True when a stop string completed (the text ends before it)."""
        if not 0 <= token < self._vocab:
            # An id beyond the tokenizer's vocabulary (models whose embedding is padded past it,
            # or random weights): it has no text.
            return False
        self._ids.append(token)
        chunk = self._decoder.step(self._backend, token)
        if chunk is None:
            self._held += 1
            return False
        self._held = 0
        return self._put(chunk)

    def _put(self, chunk: str) -> bool:
        if not chunk:
            return False
        self._decoded.append(chunk)
        try:
            self._write(chunk)
        except StopStringFound:
            return True
        return False

    def end(self) -> bool:
        """No more tokens: release what was held back. True if that completed a stop string."""
        found = False
        if self._held:
            found = self._put(self._tail())
            self._held = 0
        if self._writer is not None:
            self._writer.end()
        return found

    def _tail(self) -> str:
        """The text of the tokens held back at the end."""
        held = self._ids[len(self._ids) - self._held:]
        tail = self._tokenizer.tail_text(held)
        if tail is not None:
            return tail
        # Else as TextStream.end: the whole text's tail past what was given.
        full, given = self._tokenizer.decode(self._ids), "".join(self._decoded)
        return full[len(given):] if full.startswith(given) else self._tokenizer.decode(held)

    def take(self) -> str:
        """The text added since the last take."""
        parts = self._sink.parts
        if not parts:
            return ""
        text = parts[0] if len(parts) == 1 else "".join(parts)
        parts.clear()
        return text

    @property
    def text(self) -> str:
        """All the text so far (stop strings excluded)."""
        return "".join(self._decoded) if self._writer is None else self._writer.text
