"""Continuous batching: which requests run in the next step, and how many tokens each.

Every step is planned afresh (requests join and leave at any step), first come first served:

1. Running requests, oldest first: a decoding request runs its one pending token; a request
   still prefilling runs its next chunk of the prompt, as much as the step's token budget and
   the free pages allow. When a running request cannot get even one position's page, the newest
   running request is preempted: its pages go back to the pool (its full pages stay in the
   prefix cache, so resuming often finds them there), it returns to the waiting queue ahead of
   every request that arrived after it, and is recomputed later from its prompt and the tokens it
   already produced. If it is the one that needed the page, planning stops there.
2. Then, if nothing was preempted in this step, waiting requests in order of arrival join while
   the number of running requests is below ``max_running`` and the budget lasts: each takes the
   longest cached prefix of its tokens (``PrefixCache.attach``) and runs a first chunk of the rest.
   A new request joins only if the pool keeps ``watermark`` free pages afterwards (unless nothing
   else runs), so that running requests do not preempt it at once.

The result is a list of (request, n): run the request's next n tokens in this step. Pages for
them are reserved here, so the step itself cannot run out of pages. Mixed steps (prefill chunks
and decode rows) are normal; a step of decode rows only is what the runner can replay from a
CUDA graph.

After a step the scheduler also commits its results (``commit``: a token is appended, or the
request finishes, "stop" or "length"; ``publish``: newly full pages go to the prefix cache), and
decides whether the next step may be launched before this one's tokens are known
(``can_pipeline``: only when it is certain to be the same requests decoding one more token).
"""

from __future__ import annotations

import bisect
import math

from ..kv.cache import PagedKVCache
from ..kv.prefix_cache import PrefixCache
from .prompt_logprobs import needs_rows
from .request import FINISHED, LENGTH, RUNNING, STOP, WAITING, Request


def _insert_by_arrival(queue: list[Request], req: Request):
    queue.insert(bisect.bisect([r.arrival for r in queue], req.arrival), req)


class Scheduler:
    """Plans steps over the waiting and running requests of one page pool.

    max_running: the most requests holding pages and running at once. max_step_tokens: the
    token budget of one step (decode rows and prefill chunks together). watermark: free pages
    a new request must leave (default 1% of the pool).
    """

    def __init__(self, cache: PagedKVCache, prefix: PrefixCache | None, max_running: int = 64,
                 max_step_tokens: int = 2048, watermark: int | None = None,
                 max_len: int | None = None):
        if max_running < 1 or max_step_tokens < 1:
            raise ValueError(f"max_running and max_step_tokens must be >= 1, got {max_running}, "
                             f"{max_step_tokens}")
        self.cache, self.prefix = cache, prefix
        self.max_running, self.max_step_tokens = max_running, max_step_tokens
        self.watermark = math.ceil(0.01 * cache.num_pages) if watermark is None else watermark
        self.max_len = max_len or cache.max_seq_len  # the longest a request may grow
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.preemptions = 0

    # -- queues --------------------------------------------------------------------------------

    def add(self, req: Request):
        req.state = WAITING
        _insert_by_arrival(self.waiting, req)

    def remove(self, req: Request):
        """Take req out of the queues and give back its pages (whatever its state)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.free(req)

    def free(self, req: Request):
        if req.seq is not None:
            self.cache.release(req.seq)
        req.seq, req.page_keys = None, []

    def free_all(self):
        """Give back the pages of every request (an engine that was dropped)."""
        for req in self.running + self.waiting:
            self.free(req)

    def check_pages(self, *others: int):
        """AssertionError unless every page's references equal the running requests' pages
        (and the pages ``others`` held beside them, once each), waiting requests hold none and
        cached pages are unreferenced."""
        assert all(req.seq is not None for req in self.running)
        assert all(req.seq is None for req in self.waiting), "a waiting request holds pages"
        holders = [req.seq.pages for req in self.running] + [[page] for page in others]
        self.cache.allocator.check(held_by=holders)

    def preempt(self, req: Request):
        """Free req's pages and queue it again (ahead of the requests that came after it)."""
        self.running.remove(req)
        self.free(req)
        req.preemptions += 1
        self.preemptions += 1
        self.add(req)

    # -- planning ------------------------------------------------------------------------------

    def _room(self, req: Request) -> int:
        """Positions req's sequence can grow by: its pages' spare slots plus every free page."""
        seq, ps = req.seq, self.cache.page_size
        return len(seq.pages) * ps - len(seq) + self.cache.free_pages * ps

    def schedule(self) -> list[tuple[Request, int]]:
        """The next step: (request, number of its next tokens to run), pages reserved."""
        budget, plan, preempted = self.max_step_tokens, [], False
        i, ps = 0, self.cache.page_size
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            seq = req.seq
            if req.pending == 1 and len(seq) < len(seq.pages) * ps:  # a decode row with room
                plan.append((req, 1))
                budget -= 1
                i += 1
                continue
            while self._room(req) < 1:
                victim = self.running[-1]
                self.preempt(victim)
                preempted = True
                if victim is req:
                    break
            if req.state != RUNNING:  # it was the newest: nothing after it is left running
                break
            n = min(req.pending, budget, self._room(req))
            self.cache.reserve(req.seq, n)
            plan.append((req, n))
            budget -= n
            i += 1
        if not preempted:
            budget = self._admit(plan, budget)
        return plan

    def _admit(self, plan, budget: int) -> int:
        ps = self.cache.page_size
        while self.waiting and len(self.running) < self.max_running and budget > 0:
            req = self.waiting[0]
            tokens = req.tokens
            # A request scoring its prompt needs every prompt row run: no cached prefix.
            prefix = None if needs_rows(req) else self.prefix
            found, idle = (0, 0) if prefix is None else prefix.cached_pages_of(tokens)
            spare = self.cache.free_pages - idle - (self.watermark if self.running else 0)
            n = min(len(tokens) - found * ps, budget, spare * ps)
            if n < 1:
                break
            seq = self.cache.new_sequence()
            keys = [] if prefix is None else prefix.attach(seq, tokens)
            self.cache.reserve(seq, n)
            self.waiting.pop(0)
            req.seq, req.page_keys, req.state = seq, keys, RUNNING
            if req.preemptions == 0:
                req.cached_prompt_tokens = len(seq)
            _insert_by_arrival(self.running, req)
            plan.append((req, n))
            budget -= n
        return budget

    # -- after a step --------------------------------------------------------------------------

    def commit(self, req: Request, token: int) -> str | None:
        """Take req's sampled token: None while it goes on (the token joins its output), else
        why it finished: STOP (a stop id, not part of the output) or LENGTH (its last token)."""
        if token in req.stop_ids:
            return STOP
        req.output.append(token)
        # The next step would run this token at position num_tokens - 1: within max_len?
        if len(req.output) >= req.max_new_tokens or req.num_tokens > self.max_len:
            return LENGTH
        return None

    def finish(self, req: Request):
        """Take req out of the queues, give back its pages, mark it finished."""
        self.remove(req)
        req.state = FINISHED

    def publish(self, req: Request):
        """Publish req's newly full pages to the prefix cache (if there is one)."""
        if self.prefix is not None and req.state != FINISHED:
            self.prefix.publish(req.seq, req.page_keys)

    def can_pipeline(self, reqs: list[Request], queued: bool) -> bool:
        """Whether the step after a decode step of ``reqs`` is certain to be the same requests
        decoding one more token each (so it may be launched before this step's tokens are
        read): nothing is ``queued`` (no request added or aborted), no waiting request could
        join, every running request is in it, and none may stop for its length or wants
        log-probabilities (read from the step's logits). A request that stops on a stop id (or
        whose grammar ends) wastes its row of the launched step; anything else goes back to
        ``schedule``."""
        if queued or len(reqs) != len(self.running):
            return False
        if self.waiting and len(self.running) < self.max_running:
            return False
        return not any(r.state != RUNNING or r.logprobs is not None
                       or len(r.output) + 1 >= r.max_new_tokens
                       or r.num_tokens + 1 > self.max_len for r in reqs)
