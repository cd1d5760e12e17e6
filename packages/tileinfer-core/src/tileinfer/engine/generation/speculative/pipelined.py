"""Pipelined speculative decoding for proposers that draft on the host (``NgramProposer``).

Plain pipelined decoding (``tileinfer.engine.generation.generate``) launches step k + 1 with token k still on
the device and only then waits for token k, so the GPU never waits for Python. This loop keeps
that: every step takes its first input from the device, from a row of the step launched just
before it, and is launched before that step's tokens are read. A step is that input and 0..k
drafts after it; a step without drafts is exactly plain decoding's captured 1-token step,
sampling included, so a stretch without drafts costs what plain decoding costs.

- A step chained on row r of the step in flight, P, starts at P's position + r + 1 with P's
  output of row r as its input. The first row of P that gives a new token is certain to be
  valid; a later row is a guess that P's drafts before it are accepted. The loop chains on
  P's last row (all of P's drafts accepted) when that is likely (see below), else on the first
  new row. Either way the new step also repeats P's drafts at the positions P drafted, so that a
  position written again gets the same token.
- When the host reads P and a guess fails, the step launched on it is dropped (it still runs
  on the GPU: one wasted step), and the next one starts from the last known token, given by the
  host (with the known tokens before it whose keys and values a dropped step may have cut off).
  The host never waits for the GPU between steps.
- Drafts stop at a stop token (a copied end of the prompt's turn), and no step is launched
  after one that probably ends the answer: it would be dropped, and the answer's end waits for
  every step in flight.
- What to draft: the lookup's continuation of the known tokens and of P's drafts. How much:
  the loop keeps a moving average p of how often its guesses came true (drafts, the guessed
  input of a chained step and, where it guessed nothing, the lookup's own prediction of each
  new token, which it checks for free on the host), and measures what a step of n rows costs
  on the device against a 1-token step (CUDA events between consecutive steps, host delays
  included; kept in ``ModelRunner.step_seconds`` across generations). It drafts the count m
  that gives the most expected tokens per cost, (1 + p + .. + p**m) / cost(m + 1), if that
  gains at least ``min_gain`` and p >= ``draft_threshold`` (else none), and chains on P's last
  row when all of P's drafts hold with probability >= ``trust_threshold``. On text that does
  not repeat its context it drafts nothing; on text that copies it, it drafts up to k and
  chains every step on the one before; where extra rows are dear (a backend whose verify rows
  re-read the weights) it drafts fewer.
- Greedy verify steps take every row's argmax inside their CUDA graph
  (``ModelRunner.forward(..., sample_rows=True)``), so a verify step costs the host what a
  decode step does.

Every emitted token comes from a row whose inputs are all known tokens, computed exactly as a step
of plain decoding computes it (backends compute each row of a short step as a 1-token step does),
so greedy output equals plain greedy output. Sampled rows use the stream (seed, n) of the n-th
new token and the p/q rule with the drafts as deterministic proposals (as
``tileinfer.engine.generation.speculative.decode`` describes); a dropped row consumed nothing that an emitted
token depends on, and the drafts depend only on tokens emitted before them.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

from .ring import ring_for
from .step_costs import DraftPolicy


@dataclass
class _Step:
    """A launched step: inputs at positions start.., the device row its first input came from,
    its output tokens on the device and their host copy."""

    start: int
    inputs: list  # host view: [first (None until known), draft, ...]
    source: tuple | None  # (step, row) whose output is the first input, or None (from the host)
    out: torch.Tensor  # (n,) int32 on the device: the token after each input
    host: torch.Tensor
    event: object | None
    outputs: list[int] | None = None  # the host's copy, once read
    valid: int = 0  # once read: how many leading rows had only known tokens as inputs
    previous_event: object | None = None  # the end of the step launched before it (timing)
    timed: bool = False  # whether its time is its cost (see _Loop.SLOW_LAUNCH)
    guess: int = 0  # the placeholder of a device-given first input (a valid token id)
    sums: torch.Tensor | None = None  # (n,) float32 on the device: each row's logits' sum
    host_sums: torch.Tensor | None = None
    totals: list | None = None  # the host's copy of sums, once read (runtime/finite.py)

    @property
    def n(self) -> int:
        return len(self.inputs)

    @property
    def last(self) -> int:
        """The position of its last input."""
        return self.start + len(self.inputs) - 1


def generate_pipelined(runner, seq, ids, proposer, max_new_tokens: int, sampling, stop: set,
                       seed: int, on_token, stats) -> list[int]:
    """Continue seq with ids and generate up to max_new_tokens tokens with the host proposer's
    drafts, pipelined (see the module docstring). Returns the new tokens without the stop token;
    afterwards seq holds the input ids and every generated token but the last."""
    return _Loop(runner, seq, ids, proposer, max_new_tokens, sampling, stop, seed, on_token,
                 stats).run()


class _Done(Exception):
    pass


class _Loop:
    def __init__(self, runner, seq, ids, proposer, max_new, sampling, stop, seed, on_token,
                 stats):
        self.runner, self.seq, self.ids, self.proposer = runner, seq, ids, proposer
        self.cache, self.model = runner.cache, runner.model
        self.max_new, self.sampling, self.stop, self.seed = max_new, sampling, stop, seed
        self.on_token, self.stats = on_token, stats
        self.k = proposer.k
        self.policy = DraftPolicy(proposer, getattr(runner, "step_seconds", {}))
        self.last_event = None  # the end of the latest launched step (timing)
        self.known = [int(t) for t in seq.tokens] + ids  # every token known, by position
        self.base = len(self.known)  # the position of the first new token
        self.new: list[int] = []
        self.stopped = False
        self.guesses: dict[int, int] = {}  # position -> the token last guessed there
        self.pending: deque[_Step] = deque()
        self.ring = ring_for(runner, self.k + 1)
        self.cuda = self.ring.cuda
        self.device_counter = None  # the device counter's value after the launched work
        self.last_counter = torch.empty(1, dtype=torch.int64, device=self.model.device)
        limit = min(self.model.max_len, self.cache.max_seq_len)
        self.limit = limit

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> list[int]:
        runner = self.runner
        runner.add_sizes(range(1, self.k + 2))
        runner.seed.fill_(self.seed)
        runner.counter.zero_()
        runner.forward(self.seq, self.ids, self.sampling)  # token 0 from the stream (seed, 0)
        self.device_counter = 1
        prefill = self._record(_Step(self.base - 1, [self.known[-1]], None, runner.next_token,
                                     None, None, sums=runner.logit_sum))
        self.pending.append(prefill)
        try:
            while True:
                step = self._plan()
                if step is not None:
                    self._launch(step)
                    while len(self.pending) > 1:
                        self._read(self.pending.popleft())
                elif self.pending:  # nothing worth launching before the next result
                    self._read(self.pending.popleft())
                else:  # no room for a step ahead: run one anyway (it raises as plain would)
                    self._launch(self._restart(0, force=True))
        except _Done:
            pass
        return self._finish()

    def _finish(self) -> list[int]:
        if self.cuda:
            torch.cuda.current_stream().synchronize()  # dropped steps still write their rows
        for step in self.pending:
            if step.outputs is None:
                self.stats.wasted_steps += 1
        final = self.base + len(self.new) - (0 if self.stopped else 1)
        self.cache.truncate(self.seq, final)
        self.seq.tokens[self.base:final] = self.known[self.base:final]
        return self.new

    # -- reading results ---------------------------------------------------------------------

    def _first_input(self, step: _Step):
        """The step's first input once its source row is read (None before, and for a source
        row that was not valid: the step then stands on a failed guess)."""
        if step.inputs[0] is None and step.source is not None:
            src, row = step.source
            if src.outputs is not None and row < src.valid:
                step.inputs[0] = src.outputs[row]
        return step.inputs[0]

    def _read(self, step: _Step):
        """Wait for the step's tokens and emit the new ones its valid rows give: row j is valid
        when its inputs 0..j are the known tokens at their positions."""
        if step.event is not None:
            step.event.synchronize()
            if step.previous_event is not None and step.timed:
                # The device's time from the step before to this one: what the step cost as
                # the pipeline ran it (host delays included).
                self.policy.observe(step.n, step.previous_event.elapsed_time(step.event) / 1e3)
        step.outputs = step.host[:step.n].tolist()
        step.totals = step.host_sums[:step.n].tolist()
        known, first_unknown = self.known, len(self.known)
        self._first_input(step)
        fresh = sum(1 for j in range(1, step.n) if step.start + j >= first_unknown)
        accepted = emitted = 0
        step.valid = 0
        try:
            for j in range(step.n):
                pos = step.start + j
                if pos >= len(known) or step.inputs[j] is None or step.inputs[j] != known[pos]:
                    break  # a guess that failed (or rests on one): this row and the rest are void
                step.valid = j + 1
                if j >= 1 and pos >= first_unknown:
                    accepted += 1  # a draft at a position not known before this step
                if pos + 1 < len(known):
                    continue  # a token known already (an earlier step gave it)
                emitted += 1
                self.runner.check_finite(step.totals[j], len(self.new))
                self._emit(step.outputs[j])
        finally:
            if step.start == self.base - 1 and step.source is None and step.n == 1:
                pass  # the prefill's token: not a step of the decoding loop
            elif emitted:
                self.stats.record(fresh, accepted)
            else:
                self.stats.wasted_steps += 1

    def _emit(self, token: int):
        """Append a new token. The hit rate follows whether the token is what the loop last
        guessed at its position (a draft, or the guessed input of a chained step) or, where it
        guessed nothing, what the lookup predicts (checked here, for free)."""
        pos = len(self.known)
        guess = self.guesses.pop(pos, None)
        if guess is None:
            guess = self.proposer.prediction(self.known)
        self.policy.record_guess(guess == token)
        if token in self.stop:
            self.stopped = True
            raise _Done
        self.known.append(token)
        self.new.append(token)
        if self.on_token is not None:
            self.on_token(token)
        if len(self.new) == self.max_new:
            raise _Done

    # -- planning the next step --------------------------------------------------------------

    def _room(self, start: int) -> int:
        """How many positions a step starting at start may take (the cache's pages and the
        longest sequence allowed), counting the pages seq holds past start as free."""
        cache, seq = self.cache, self.seq
        pages = (len(seq.pages) + cache.free_pages) * cache.page_size
        return min(self.limit, pages) - start

    def _fit(self, start: int, drafts: list[int]) -> list[int] | None:
        """The drafts a step at start may take (none past the last token asked for, or past the
        room), or None when the step is not needed or does not fit at all."""
        first_new = start + 1 - self.base  # the index of the token its first row gives
        if first_new >= self.max_new:
            return None
        room = self._room(start)
        if room < 1:
            return None
        drafts = drafts[:max(0, min(self.max_new - 1 - first_new, room - 1))]
        # Up to a stop token, without it: the row before it already gives it (the stop token
        # as an input would only give a token past the answer's end).
        ends = next((i for i, t in enumerate(drafts) if t in self.stop), None)
        return drafts if ends is None else drafts[:ends]

    def _plan(self) -> _Step | None:
        """The next step: chained on the step in flight where that can give new tokens, else
        from the last known token (see the module docstring)."""
        known = self.known
        prev = self.pending[-1] if self.pending else None
        if prev is None:
            return self._restart(self.policy.budget())
        settled = len(known) - 1 - prev.start  # prev's first row that gives a new token
        usable = (0 <= settled < prev.n and self._first_input(prev) is not None
                  and all(prev.inputs[j] == known[prev.start + j] for j in range(settled + 1)))
        if not usable:  # its tokens are known, or it stands on a failed guess: start afresh
            self.pending.pop()
            if prev.outputs is None:
                self.stats.wasted_steps += 1
            return self._restart(self.policy.budget())
        budget = self.policy.budget()
        guessed = prev.inputs[settled + 1:]  # prev's drafts at positions not known yet
        trusted = self.policy.trusted(len(guessed))
        rows = [prev.n - 1, settled] if trusted and guessed else [settled]
        # Without drafts to make or to chain on, no lookup: the hit rate checks the lookup's
        # prediction when the token comes (``_emit``), and the first lookup, which indexes the
        # whole prompt, then runs while the step launched here computes.
        need = len(guessed) + budget + 1 if (budget or (trusted and guessed)) else len(guessed)
        # future[i]: the guess of the token at position len(known) + i.
        future = guessed + self.proposer.continuation(known, guessed, need - len(guessed))
        if trusted and any(t in self.stop for t in future[:len(guessed) + 1]):
            return None  # prev's rows likely give a stop token: a step after it is dropped
        for row in rows:
            offset = row - settled  # the new step's first position is len(known) + offset
            start = prev.start + row + 1
            if start + 1 - self.base >= self.max_new:
                return None  # prev gives the last token asked for, if its drafts hold
            # At least up to prev's last draft: positions prev wrote are written again with
            # the same tokens, never cut off (prev's drafts may all be accepted).
            count = max(budget, len(guessed) - offset - 1)
            drafts = self._fit(start, future[offset + 1:offset + 1 + count])
            if drafts is not None:
                guess = future[offset] if offset < len(future) else None
                self._guessed(len(known), future[:offset + 1 + len(drafts)])
                return _Step(start, [None, *drafts], (prev, row), prev.out, None, None,
                             guess=0 if guess is None else guess)
        return None

    def _restart(self, budget: int, force: bool = False) -> _Step | None:
        """A step whose inputs the host gives: the known tokens from the end of the cached ones
        that are certain (a step in flight may have been cut back to a position before the
        last known token), then drafts (force: even with no room, so that the step raises as
        plain decoding would)."""
        known = self.known
        start = min(len(self.seq), len(known) - 1)
        catch_up = known[start:]
        drafts = self.proposer.continuation(known, (), budget) if budget else []
        drafts = drafts[:max(0, self.k + 1 - len(catch_up))]  # within the captured sizes
        fitted = self._fit(len(known) - 1, drafts)
        if fitted is None:
            if not force:
                return None
            fitted = []
        self._guessed(len(known), fitted)
        return _Step(start, [*catch_up, *fitted], None, None, None, None)

    def _guessed(self, first: int, tokens):
        """Remember the tokens the loop now guesses at positions first.. (and no older ones)."""
        self.guesses.clear()
        for i, token in enumerate(tokens):
            self.guesses[first + i] = token

    # -- launching ---------------------------------------------------------------------------

    def _set_counter(self, value: int):
        if not self.sampling.greedy and self.device_counter != value:
            self.runner.counter.fill_(value)
        self.device_counter = value

    # A launch that kept the host longer than this (capturing the step's CUDA graph, a garbage
    # collection) left the device idle: the step's time then says nothing of its cost.
    SLOW_LAUNCH = 0.002

    def _launch(self, step: _Step):
        started = time.perf_counter()
        self._launch_step(step)
        seconds = time.perf_counter() - started
        if not self.cuda:  # the step ran on the host: its cost is its time
            self.policy.observe(step.n, seconds)
        step.timed = seconds < self.SLOW_LAUNCH

    def _launch_step(self, step: _Step):
        runner, seq, sampling = self.runner, self.seq, self.sampling
        if len(seq) > step.start:
            self.cache.truncate(seq, step.start)
        if len(seq) != step.start:
            raise RuntimeError(f"speculative step at {step.start} after {len(seq)} positions")
        first_new = step.start + 1 - self.base  # the stream index of its first row's token
        n = step.n
        if step.source is not None:
            src_step, row = step.source
            source = src_step.out[row:row + 1]
        else:
            source = None
        if n == 1:
            self._set_counter(first_new)
            if source is None:
                runner.forward(seq, [step.inputs[0]], sampling)
            else:
                if source.data_ptr() != runner.next_token.data_ptr():
                    runner.next_token.copy_(source)
                runner.decode_from_device(seq, sampling)
            self.device_counter = first_new + 1  # the captured step advanced it
            step.out, step.sums = runner.next_token, runner.logit_sum
        elif sampling.greedy:  # every row's argmax, inside the step's graph
            ids = [step.guess if source is not None else step.inputs[0], *step.inputs[1:]]
            runner.forward(seq, ids, sampling, all_logits=True, first_from=source,
                           sample_rows=True)
            step.out, step.sums = runner.row_tokens(n), runner.row_sums(n)
        else:
            ids = [step.guess if source is not None else step.inputs[0], *step.inputs[1:]]
            logits = runner.forward(seq, ids, all_logits=True, first_from=source)
            i = self.ring.take()
            out, drafts_host, drafts = self.ring.sampled(i)
            out, drafts_host, drafts = out[:n], drafts_host[:n - 1], drafts[:n - 1]
            self._set_counter(first_new)
            ops, t, m = self.model.ops, sampling.temperature, n - 1
            # The p/q rule on rows 0..m-1 (the drafts: the step's inputs 1..m), a sample on m.
            drafts_host.copy_(torch.tensor(step.inputs[1:], dtype=torch.int32))
            drafts.copy_(drafts_host, non_blocking=self.cuda)
            ops.accept_tokens(out[:m], logits[:m], drafts, None, t, sampling.top_k,
                              sampling.top_p, runner.seed, runner.counter)
            torch.add(runner.counter, m, out=self.last_counter)
            ops.sample_tokens(out[m:], logits[m:], t, sampling.top_k, sampling.top_p,
                              runner.seed, self.last_counter, None)
            step.out, step.sums = out, logits[:n].sum(dim=1)
            self.ring.record(i)
        self._record(step)
        self.pending.append(step)

    def _record(self, step: _Step) -> _Step:
        """Queue the copy of the step's tokens and logits' sums to the host, and an event after
        it."""
        i = self.ring.take()
        step.host, step.host_sums = self.ring.host[i], self.ring.host_sums[i]
        step.host[:step.n].copy_(step.out, non_blocking=self.cuda)
        step.host_sums[:step.n].copy_(step.sums, non_blocking=self.cuda)
        step.event = self.ring.record(i)
        step.previous_event, self.last_event = self.last_event, step.event
        return step
