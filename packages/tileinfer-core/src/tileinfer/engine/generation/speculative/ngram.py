"""Prompt lookup: draft the tokens that followed the latest earlier occurrence of the last n tokens.

Text that repeats its input (a paragraph rewritten with small changes, code edited in place,
quotes) continues an earlier stretch of the sequence; the last few tokens find it. n goes from
max_ngram down to min_ngram: a longer match is a better predictor, a shorter one matches more often.

The lookup runs on the host in microseconds and can extend a sequence the host does not know yet
(``continuation``: after tokens the device is still computing, guessed), so the speculative loop
runs it pipelined (``tileinfer.engine.generation.speculative.pipelined``): it drafts only while the lookup's
predictions keep coming true, which it checks on every token for free.
"""

from __future__ import annotations

from .proposer import Proposer, check_k


class NgramProposer(Proposer):
    """Up to k drafts by prompt lookup over the whole sequence (prompt and generated tokens).

    An index maps every n-gram (min_ngram <= n <= max_ngram) that some token follows to the end
    of its latest occurrence, so a proposal costs O(max_ngram), and the index grows by
    O(max_ngram) per new token (it is rebuilt when the sequence is not an extension of the last
    one seen, e.g. a new chat turn that rewrote the end).

    adaptive (default): the speculative loop drafts only while the lookup's guesses keep coming
    true and the extra rows pay (``tileinfer.engine.generation.speculative.pipelined``): from a moving
    average p of its hits (``smoothing``: the weight of the latest token), nothing while p <
    ``draft_threshold``, else the count (at most k) with the most expected tokens per measured
    cost of a step, if it gains ``min_gain``; it launches a step before the one in flight is
    checked on all of that one's drafts when they all hold with probability >=
    ``trust_threshold``, by the average begun as if ``prior_misses`` guesses had failed (a
    right guess or two is not yet a reason to bet a whole step on them). ``row_cost``: None
    measures what a step of n rows costs; a number fixes an extra row's cost (in 1-token steps)
    instead. adaptive=False: k drafts whenever the lookup finds a match, each step chained on
    all drafts of the one before.
    """

    smoothing = 0.25
    draft_threshold = 0.55
    trust_threshold = 0.5
    min_gain = 1.1
    prior_misses = 1.0
    row_cost: float | None = None

    # k = 7: a verify step of k + 1 = 8 rows, the most a single sequence's captured steps take
    # (the speculative benchmark's setting, benchmarks/RESULTS.md)
    def __init__(self, k: int = 7, max_ngram: int = 3, min_ngram: int = 1,
                 adaptive: bool = True):
        self.k = check_k(k)
        for name, n in (("max_ngram", max_ngram), ("min_ngram", min_ngram)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {n!r}")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram ({min_ngram}) exceeds max_ngram ({max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.adaptive = bool(adaptive)
        self._tokens: list[int] = []  # the tokens indexed (a copy)
        self._source: list[int] | None = None  # the caller's list, when it only grows
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of latest one

    def __repr__(self):
        return (f"NgramProposer(k={self.k}, max_ngram={self.max_ngram}, "
                f"min_ngram={self.min_ngram}, adaptive={self.adaptive})")

    def _sync(self, tokens: list[int], grows: bool = False):
        """Index tokens. grows: tokens is the list object given last time, only appended to
        since (the pipelined loop's), so its indexed prefix need not be compared again."""
        seen = len(self._tokens)
        if not (grows and tokens is self._source and len(tokens) >= seen):
            if len(tokens) < seen or tokens[:seen] != self._tokens:
                self._tokens, self._latest, seen = [], {}, 0
        self._source = tokens if grows else None
        for t in range(max(seen, 1), len(tokens)):
            # tokens[t] now follows the n-grams that end just before t.
            for n in range(self.min_ngram, min(self.max_ngram, t) + 1):
                self._latest[tuple(tokens[t - n:t])] = t
        self._tokens.extend(tokens[seen:])

    def _match(self, tokens: list[int], tail) -> int | None:
        """Where the continuation of tokens + tail starts in tokens: the position after the
        latest indexed occurrence of its longest suffix n-gram (None if none)."""
        end = len(tokens) + len(tail)
        for n in range(min(self.max_ngram, end - 1), self.min_ngram - 1, -1):
            if n <= len(tail):
                key = tuple(tail[len(tail) - n:])
            else:
                key = tuple(tokens[len(tokens) - (n - len(tail)):]) + tuple(tail)
            start = self._latest.get(key)
            if start is not None:
                return start
        return None

    def propose(self, tokens, k: int) -> list[int]:
        tokens = [int(t) for t in tokens]
        self._sync(tokens)
        # Only earlier occurrences are indexed: the suffix itself has no follower yet.
        start = self._match(tokens, ())
        return [] if start is None else tokens[start:start + k]

    def prediction(self, tokens: list[int]) -> int | None:
        """The token the lookup predicts after tokens (a list that only grows between calls, as
        the pipelined loop keeps it), or None."""
        self._sync(tokens, grows=True)
        start = self._match(tokens, ())
        return None if start is None else tokens[start]

    def continuation(self, tokens: list[int], tail, n: int) -> list[int]:
        """Up to n tokens predicted to follow tokens + tail (tail: guessed tokens after the known
        ones, not indexed). The match's continuation is copied on past the end of the sequence
        (a repeating stretch repeats on), so it is n long whenever there is a match.
        tokens: a list that only grows between calls (see ``prediction``)."""
        if n <= 0:
            return []
        self._sync(tokens, grows=True)
        start = self._match(tokens, tail)
        if start is None:
            return []
        known, end = len(tokens), len(tokens) + len(tail)
        out: list[int] = []
        for i in range(n):
            p = start + i
            out.append(tokens[p] if p < known else tail[p - known] if p < end else out[p - end])
        return out
