"""How much the pipelined speculative loop drafts: a cost model of steps and a hit rate.

The loop keeps a moving average p of how often its guesses came true (bias-corrected, as
Adam's moments are: an average started at 0 would read low for its first few tokens, and an
answer that copies from its first token would spend them on plain steps), and knows what a
step of n rows costs on the device against a 1-token step: measured between consecutive steps
(CUDA events, host delays included) and kept in the runner's ``step_seconds`` across
generations (the model runtime's: every generation of the process shares them). It drafts the
count m that gives the most expected tokens per cost, (1 + p + .. + p**m) / cost(m + 1), if
that gains at least ``min_gain`` and p >= ``draft_threshold`` (else none), and chains the next
step on all of the step in flight's drafts when they all hold with probability >=
``trust_threshold``, by the same average begun as if ``prior_misses`` guesses had failed before
the first (``trust_rate``; the prior fades as the average's older terms do). A wrong draft costs
its row; a step chained on it is thrown away whole, so chaining waits for more evidence: with
the plain average one or two right guesses read as p = 1, and a short answer whose next token
leaves the copied stretch paid for a whole step that nothing paid back.
"""

from __future__ import annotations

from .ngram import NgramProposer

KEPT = 5  # the latest measurements kept of each row count


def record_step_seconds(step_seconds: dict, n: int, seconds: float):
    """Add a measured cost of an n-row step to ``step_seconds`` (row count -> the latest
    ``KEPT`` seconds)."""
    recent = step_seconds.setdefault(n, [])
    recent.append(seconds)
    del recent[:-KEPT]


class DraftPolicy:
    """The drafting decisions of one pipelined speculative generation (see the module
    docstring). The thresholds come from the proposer's attributes where it has them, else
    NgramProposer's (the values tuned for prompt lookup)."""

    def __init__(self, proposer, step_seconds: dict):
        def setting(name):
            return getattr(proposer, name, getattr(NgramProposer, name))

        self.k = proposer.k
        self.adaptive = setting("adaptive")
        self.smoothing = setting("smoothing")
        self.draft_threshold = setting("draft_threshold")
        self.trust_threshold = setting("trust_threshold")
        self.min_gain = setting("min_gain")
        self.prior_misses = setting("prior_misses")  # in guesses' weights
        self.row_cost = setting("row_cost")  # None: measured
        self.step_seconds = step_seconds
        self.hit_rate = 0.0  # how often the guesses came true lately (a moving average)
        self.trust_rate = 0.0  # the same with the prior's misses: what chaining rests on
        # The average of hits, and of ones, with the same weights: their ratio is the average
        # over the guesses seen so far, without the pull towards the starting 0. The prior's
        # misses weigh as guesses made before the first, fading as the older terms do.
        self._hits = self._weights = 0.0
        self._prior = self.smoothing * self.prior_misses

    def record_guess(self, hit: bool):
        """A new token came: whether the loop's guess of it (if any) was right."""
        a = self.smoothing
        self._hits = (1 - a) * self._hits + a * hit
        self._weights = (1 - a) * self._weights + a
        self._prior *= 1 - a
        self.hit_rate = self._hits / self._weights
        self.trust_rate = self._hits / (self._weights + self._prior)

    PRIOR_ROW_COST = 0.1  # an extra row's cost, in 1-token steps, before any is measured

    def observe(self, n: int, seconds: float):
        record_step_seconds(self.step_seconds, n, seconds)

    def _seconds(self, n: int) -> float | None:
        """The measured cost of an n-row step: the median of the last 5 (the smallest of fewer
        than 3: the first step of a size may include capturing its CUDA graph)."""
        recent = self.step_seconds.get(n)
        if not recent:
            return None
        ordered = sorted(recent)
        return ordered[len(ordered) // 2] if len(ordered) >= 3 else ordered[0]

    def _ratio(self, n: int) -> float:
        """What an n-row step costs against a 1-token step: measured where it was, else the
        steepest measured cost per extra row (PRIOR_ROW_COST before any)."""
        if n == 1:
            return 1.0
        if self.row_cost is not None:
            return 1.0 + self.row_cost * (n - 1)
        one = self._seconds(1)
        if not one:
            return 1.0 + self.PRIOR_ROW_COST * (n - 1)
        seconds = self._seconds(n)
        if seconds is not None:
            return max(1.0, seconds / one)
        slopes = [(self._seconds(m) / one - 1) / (m - 1) for m in self.step_seconds if m > 1]
        return 1.0 + max(slopes + [self.PRIOR_ROW_COST]) * (n - 1)

    def budget(self) -> int:
        """Drafts for the next step: the count m that gives the most tokens per unit of cost,
        if each draft holds with the recent hit rate p: (1 + sum p**i) tokens for the cost of
        an (m + 1)-row step (the accepted drafts count half when the next step cannot be chained
        on them); none while p < draft_threshold or when no count gains min_gain."""
        if not self.adaptive:
            return self.k
        p = self.hit_rate
        if p < self.draft_threshold:
            return 0
        best, best_m, gain = self.min_gain, 0, 0.0
        for m in range(1, self.k + 1):
            gain += p ** m
            chained = self.trust_rate ** m >= self.trust_threshold
            value = (1.0 + (gain if chained else 0.5 * gain)) / self._ratio(m + 1)
            if value > best:
                best, best_m = value, m
        return best_m

    def trusted(self, guessed: int) -> bool:
        """Chain the next step on all of the step in flight's guessed drafts: when they are all
        accepted with probability at least trust_threshold (see ``_budget``)."""
        return not self.adaptive or self.trust_rate ** guessed >= self.trust_threshold
