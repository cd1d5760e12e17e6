"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of the last n tokens.

Text that repeats its input (a paragraph rewritten with small changes, code edited in place,
quotes) continues an earlier stretch of the sequence; the last few tokens find it. n goes from
max_ngram down to min_ngram: a longer match is a better predictor, a shorter one matches more often.
"""

from __future__ import annotations

from .proposer import Proposer, check_k


class NgramProposer(Proposer):
    """Up to k drafts by prompt lookup over the whole sequence (prompt and generated tokens).

    An index maps every n-gram (min_ngram <= n <= max_ngram) that some token follows to the end
    of its latest occurrence, so a proposal costs O(max_ngram), and the index grows by
    O(max_ngram) per new token (it is rebuilt when the sequence is not an extension of the last
    one seen, e.g. a new chat turn that rewrote the end).
    """

    def __init__(self, k: int = 4, max_ngram: int = 3, min_ngram: int = 1):
        self.k = check_k(k)
        for name, n in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) exceeds max_ngram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self._tokens: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of latest one

    def __repr__(self):
        return f"NgramProposer(k={self.k}, max_ngram={self.max_ngram}, min_ngram={self.min_ngram})"

    def _sync(self, tokens: list[int]):
        seen = len(self._tokens)
        if len(tokens) < seen or tokens[:seen] != self._tokens:
            self._tokens, self._latest, seen = [], {}, 0
        for t in range(max(seen, 1), len(tokens)):
            # tokens[t] now follows the n-grams that end just before t.
            for n in range(self.min_ngram, min(self.max_ngram, t) + 1):
                self._latest[tuple(tokens[t - n:t])] = t
        self._tokens = tokens

    def propose(self, tokens, k: int) -> list[int]:
        tokens = [int(t) for t in tokens]
        self._sync(tokens)
        end = len(tokens)
        for n in range(min(self.max_ngram, end - 1), self.min_ngram - 1, -1):
            # Only earlier occurrences are indexed: the suffix itself has no follower yet.
            start = self._latest.get(tuple(tokens[end - n:]))
            if start is not None:
                return tokens[start:start + k]
        return []
