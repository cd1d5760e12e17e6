"""Stop strings: text that ends the answer when the model writes it (``--stop``).

A stop string may be split across tokens, so the writer holds back any tail of the text that
could be the start of one; when a stop string completes, the text before it is written, the stop
string itself is not, and ``StopStringFound`` ends the generation (raised from the token
callback: ``generate`` rolls its cache back and re-raises it).
"""

from __future__ import annotations


class StopStringFound(Exception):
    """Raised by ``StopWriter.write`` when a stop string appears; ``stop`` is the one found."""

    def __init__(self, stop: str):
        super().__init__(stop)
        self.stop = stop


class StopWriter:
    """A file-like object for ``TextStream``: writes text to ``out`` up to the first stop string."""

    def __init__(self, stops, out):
        self.stops = [s for s in stops if s]
        self.out = out
        self.pending = ""
        self.written: list[str] = []
        self.found: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.written)

    def _emit(self, text: str):
        if text:
            self.written.append(text)
            self.out.write(text)

    def write(self, chunk: str):
        if self.found is not None:
            return
        self.pending += chunk
        hits = [(self.pending.find(s), -len(s), s) for s in self.stops if s in self.pending]
        if hits:
            start, _, stop = min(hits)
            self._emit(self.pending[:start])
            self.pending = ""
            self.found = stop
            self.flush()
            raise StopStringFound(stop)
        keep = 0  # the longest tail of pending that a stop string starts with
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.pending)), keep, -1):
                if stop.startswith(self.pending[-k:]):
                    keep = k
                    break
        self._emit(self.pending[:len(self.pending) - keep])
        self.pending = self.pending[len(self.pending) - keep:]

    def flush(self):
        self.out.flush()

    def end(self):
        """The generation ended without a stop string: write what was held back."""
        if self.found is None:
            self._emit(self.pending)
        self.pending = ""
        self.flush()
