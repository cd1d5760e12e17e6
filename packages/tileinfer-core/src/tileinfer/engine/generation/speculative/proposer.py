"""The proposer interface of speculative decoding, and the counters of a speculative generation.

A proposer guesses the next few tokens of a sequence cheaply; the target model then checks all of
them in one step (``tileinfer.speculative.decode``). ``propose(tokens, k)`` returns up to k draft
token ids to follow ``tokens`` (every token of the sequence so far, the last one included), or
none. A proposer that samples its drafts returns a ``Draft``: the ids with the distributions q they
were drawn from, which the p/q rule needs; plain lists of ids are deterministic drafts (q one-hot).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Drafters draw their random numbers from the stream (draft_seed(seed), counter), never from the
# target's (seed, counter): the p/q rule is exact only when a draft is independent of the
# randomness that accepts or replaces it.
_DRAFT_SEED_SALT = 0x2545F4914F6CDD1D


def draft_seed(seed: int) -> int:
    """The seed of a drafter's random stream in a generation seeded with ``seed``."""
    return (int(seed) ^ _DRAFT_SEED_SALT) & ((1 << 63) - 1)


def check_k(k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k (drafts per step) must be an integer >= 1, got {k!r}")
    return k


def check_proposer(proposer):
    """TypeError unless proposer is None or a proposer object (it has ``propose``)."""
    if proposer is not None and not callable(getattr(proposer, "propose", None)):
        raise TypeError(
            "speculative takes a proposer object: tileinfer.NgramProposer(), "
            "tileinfer.DraftProposer(draft_model) or "
            f"tileinfer.DFlashProposer(tileinfer.load_dflash(...)); got {proposer!r}")


class Draft(list):
    """Draft token ids (a list) and, for sampled drafts, ``probs``: the (len, vocab) float32
    device tensor whose row j is the distribution q that draft j was drawn from. ``probs`` is
    None for deterministic drafts."""

    def __init__(self, ids=(), probs=None):
        super().__init__(int(i) for i in ids)
        self.probs = probs

    def truncated(self, k: int) -> "Draft":
        return Draft(self[:k], None if self.probs is None else self.probs[:k])


class Proposer:
    """Base class of proposers: ``k`` drafts per step by default, ``propose`` to draft.

    ``begin(runner, seq, sampling, seed)`` is called once at the start of each speculative
    generation with the target's runner, the sequence it continues, the sampling parameters and
    the generation's seed (a drafter model checks its vocabulary and seeds its stream here).

    adaptive: the loop drafts fewer tokens (down to none) while drafts are rejected and more
    again when they are accepted (``DraftBudget``); False drafts k tokens every step.
    """

    k: int = 4
    adaptive: bool = True

    def begin(self, runner, seq, sampling, seed: int):
        pass

    def propose(self, tokens, k: int) -> list[int]:
        raise NotImplementedError


class DraftBudget:
    """How many tokens the synchronous loop drafts next, from the recent acceptance: k to begin
    with; after a step whose drafts were all accepted, twice as many (at most k); after a partly
    accepted one, one more than were accepted; after a step whose drafts were all rejected, none
    for 1, 2, 4 .. 32 steps (doubling with each such miss in a row), then a probe of one draft.
    Not adaptive: always k."""

    MAX_WAIT = 32

    def __init__(self, k: int, adaptive: bool = True):
        self.k, self.adaptive = k, adaptive
        self.size, self.wait, self.misses = k, 0, 0

    def next(self) -> int:
        if not self.adaptive:
            return self.k
        if self.wait > 0:
            self.wait -= 1
            return 0
        return self.size

    def record(self, drafted: int, accepted: int):
        if not self.adaptive or drafted == 0:
            return
        if accepted == drafted:
            self.size, self.misses = min(self.k, 2 * drafted), 0
        elif accepted > 0:
            self.size, self.misses = min(self.k, accepted + 1), 0
        else:
            self.misses += 1
            self.size, self.wait = 1, min(2 ** (self.misses - 1), self.MAX_WAIT)


@dataclass
class SpecStats:
    """Counters of speculative generations (accumulated over the generations it is passed to).

    verify_steps: target steps that checked at least one draft; plain_steps: target steps
    without drafts (the proposer had none, the loop chose not to draft, or no room was left);
    drafted, accepted: draft tokens proposed and accepted. wasted_steps: steps the pipelined loop
    launched on a guess that turned out wrong (an earlier step's drafts were rejected), whose
    results it dropped. Drafts a pipelined step checks again at positions an earlier step
    already settled are not counted twice.
    """

    verify_steps: int = 0
    plain_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    wasted_steps: int = 0

    def record(self, drafted: int, accepted: int):
        if drafted:
            self.verify_steps += 1
        else:
            self.plain_steps += 1
        self.drafted += drafted
        self.accepted += accepted

    @property
    def acceptance_rate(self) -> float:
        """Fraction of drafted tokens accepted (NaN before any draft)."""
        return self.accepted / self.drafted if self.drafted else math.nan

    @property
    def mean_accepted_length(self) -> float:
        """Drafts accepted per verify step (NaN before any); each verify step also emits one
        token of the target's own, so it yields ``mean_accepted_length + 1`` tokens."""
        return self.accepted / self.verify_steps if self.verify_steps else math.nan

    def summary(self) -> str:
        wasted = f", {self.wasted_steps} wasted" if self.wasted_steps else ""
        if not self.drafted:
            return f"speculative: no drafts in {self.plain_steps} steps{wasted}"
        return (f"speculative: {self.accepted}/{self.drafted} drafts accepted "
                f"({100 * self.acceptance_rate:.0f}%), {self.mean_accepted_length + 1:.2f} tokens "
                f"per verify step, {self.verify_steps} verify + {self.plain_steps} plain "
                f"steps{wasted}")
