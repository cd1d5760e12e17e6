"""A choice's text, built token by token: what ``tileinfer run`` prints, as pieces to send.

``tileinfer.TextStream`` decodes incrementally and holds back a token that ends inside a
multi-byte character until the character completes; ``StopWriter`` (the CLI's ``--stop``) holds
back any tail that could start a stop string and ends the text before the first one found. So
every piece ``take()`` returns is whole characters, and the pieces add up to exactly the text of
a non-streamed answer, however the tokens were grouped into steps.
"""

from __future__ import annotations

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
        from tileinfer import TextStream

        self._sink = _Sink()
        self._writer = StopWriter(stops, self._sink)
        self._stream = TextStream(tokenizer, self._writer)
        self._vocab = tokenizer.vocab_size

    def add(self, token: int) -> bool:
        """Decode one more token; True when a stop string completed (the text ends before it)."""
        if not 0 <= token < self._vocab:
            # An id beyond the tokenizer's vocabulary (models whose embedding is padded past it,
            # or random weights): it has no text.
            return False
        try:
            self._stream.put(token)
        except StopStringFound:
            return True
        return False

    def end(self) -> bool:
        """No more tokens: release what was held back. True if that completed a stop string."""
        found = False
        try:
            self._stream.end()
        except StopStringFound:
            found = True
        self._writer.end()
        return found

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
        return self._writer.text
