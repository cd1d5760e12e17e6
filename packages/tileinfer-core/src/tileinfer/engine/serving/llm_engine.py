"""LLMEngine: one model, one KV page pool, many requests in flight.

    engine = LLMEngine(model)
    rid = engine.add_request(prompt_ids, SamplingParams(0.7, top_p=0.9), max_new_tokens=128)
    while engine.has_unfinished():
        for out in engine.step():      # RequestOutput: new tokens, finished, why
            ...

Each ``step`` has the ``Scheduler`` plan a step (decode rows and prefill chunks under a token
budget, preemption when pages run out), the ``BatchRunner`` run it and sample each finished row
with its request's parameters and stream (seed, k), and the scheduler commit the tokens. The
engine keeps only the bookkeeping: the queue of added and aborted requests, the outputs not
returned yet, and the step launched ahead. The KV pool, static steps and CUDA graphs are the
model runtime's (``engine/runtime``): an engine grows the pool to its size, a later engine finds
the graphs captured, and engines and generations on one model take turns step by step.

Threads: ``add_request`` and ``abort`` may be called from any thread; they queue under a short
lock and ``step`` takes the queue at its start (``abort`` frees the pages at once when no step
runs). ``EngineThread`` runs the step loop on a background thread.

Pipelining: while the scheduler is sure the next step is the same requests decoding one more
token (``Scheduler.can_pipeline``), it is launched from the current step's sampled ids still on
the device, and the host reads and commits the current one while the GPU runs. Requests with
grammars are sampled after that commit (their masks need the tokens), their forward running.

Faults: a step that raises fails the requests in it (pages given back, finish_reason "error")
and the engine goes on with the others; ``add_request`` refuses bad requests (``RequestError``).
"""

from __future__ import annotations

import itertools
import threading
import weakref

import torch

from ...backend.sampling import SamplingParams
from ..kv.cache import check_pool_args
from ..kv.prefix_cache import PrefixCache
from ..runtime.finite import non_finite
from ..runtime.runtime import runtime_of
from .batch_grammar import advance as advance_grammar
from .batch_runner import BatchRunner
from .batch_sampling import sampled_logprobs
from .engine_stats import engine_stats
from .launched_step import LaunchedStep
from .pool import engine_pool
from .prompt_logprobs import collect, needs_rows, report
from .request import (ABORT, ERROR, FINISHED, LENGTH, RUNNING, STOP, Request, RequestOutput,
                      check_request, request_limits)
from .scheduler import Scheduler

DEFAULT_MAX_RUNNING = 64


POOL_GONE = ("this LLMEngine's KV pool is gone (the model was closed, or the pool made anew for "
             "another page size, precision or size while the engine was idle): make a new one")


class LLMEngine:
    """Serves many requests on ``model`` from its runtime's paged KV pool.

    num_pages: the pool's pages for requests (default ``kv_pool_pages``: a ``memory_fraction``
    of the GPU, or ``cpu_tokens`` positions on the CPU); given, the pool is made exactly that
    size (plus the runtime's scratch page), which needs it idle. max_running: the most
    requests in a step (also the largest CUDA-graph bucket). max_step_tokens: a step's token
    budget (prefill chunks + decode rows). prefix_caching: share full pages of common
    prefixes. graphs: CUDA graphs for static steps (None: on CUDA with a graph-safe backend).
    kv_quantize / key_smoothing: as ``new_cache``. watermark: free pages a new request must
    leave (default 1% of the pool). static_decode, static_mixed: see ``BatchRunner``.
    pipeline: launch a static decode step before reading the previous one's tokens (``step``).
    """

    def __init__(self, model, num_pages: int | None = None, page_size: int = 16,
                 max_running: int = DEFAULT_MAX_RUNNING, max_step_tokens: int = 2048,
                 prefix_caching: bool = True, graphs: bool | None = None,
                 kv_quantize: str | None = None, key_smoothing=None,
                 memory_fraction: float = 0.9, cpu_tokens: int | None = None,
                 watermark: int | None = None, static_decode: bool | None = None,
                 pipeline: bool = True, static_mixed: bool | None = None):
        check_pool_args(model.config, num_pages, page_size, kv_quantize, key_smoothing)
        self.model = model
        runtime = self.runtime = runtime_of(model)
        with runtime.lock:
            self.cache = engine_pool(runtime, num_pages, page_size, kv_quantize, key_smoothing,
                                     fraction=memory_fraction, cpu_tokens=cpu_tokens,
                                     max_step_tokens=max_step_tokens, max_batch=max_running,
                                     graphs=graphs, static_mixed=static_mixed)
            self.runner = BatchRunner(model, runtime, graphs, max_batch=max_running,
                                      static_decode=static_decode, static_mixed=static_mixed)
        self.closed = False
        self.prefix = PrefixCache(self.cache) if prefix_caching else None
        self.scheduler = Scheduler(self.cache, self.prefix, max_running, max_step_tokens,
                                   watermark, max_len=model.max_len)
        # An engine dropped without close() gives its requests' pages back when collected.
        self._finalizer = weakref.finalize(self, self.scheduler.free_all)
        self._requests: dict[int, Request] = {}  # taken in by a step, not finished
        self._inbox: list[tuple[str, object]] = []  # ("add", Request) / ("abort", id)
        self._live: set[int] = set()  # added and not finished
        self._aborting: set[int] = set()  # of those, aborted: an abort is queued
        self._pending: list[RequestOutput] = []  # outputs not returned by step() yet
        self._inbox_lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._ids = itertools.count()
        self.pipeline = pipeline
        self._inflight: LaunchedStep | None = None  # launched by the last step(), not completed
        self.steps = self.generated_tokens = self.pipelined_steps = 0
        runtime.engines.add(self)  # the pool is not made anew under an open engine

    @property
    def num_pages(self) -> int:
        """Pages of the pool for requests (not the runtime's scratch page)."""
        return self.cache.num_pages - 1

    # -- requests ------------------------------------------------------------------------------

    def add_request(self, prompt_ids, sampling: SamplingParams = SamplingParams(),
                    max_new_tokens: int = 256, stop_ids=None, seed: int | None = None,
                    logprobs: int | None = None, prompt_logprobs: int | None = None,
                    min_new_tokens: int = 0, hidden_state: bool = False) -> int:
        """Queue a request; returns its id. RequestError (a ValueError) if the engine refuses it.
        The arguments are ``request.check_request``'s."""
        return self.add_checked(check_request(prompt_ids, sampling, max_new_tokens, stop_ids,
                                              seed, **request_limits(self), logprobs=logprobs,
                                              prompt_logprobs=prompt_logprobs,
                                              min_new_tokens=min_new_tokens,
                                              hidden_state=hidden_state))

    def add_checked(self, args: dict) -> int:
        """Queue a request whose arguments check_request gave (with request_limits(self))."""
        if self.runtime.cache is not self.cache:  # see POOL_GONE
            raise RuntimeError(POOL_GONE)
        with self._inbox_lock:
            rid = next(self._ids)
            self._inbox.append(("add", Request(rid, arrival=rid, **args)))
            self._live.add(rid)
        return rid

    def abort(self, request_id: int) -> bool:
        """Stop a request; its pages are freed and the next ``step`` reports it finished with
        reason "abort". False if no such request is unfinished (or it is already aborted)."""
        with self._inbox_lock:
            if request_id not in self._live or request_id in self._aborting:
                return False
            self._aborting.add(request_id)
            self._inbox.append(("abort", request_id))
        if self._step_lock.acquire(blocking=False):  # no step running: free the pages now
            try:
                self._drain()
            finally:
                self._step_lock.release()
        return True

    def has_unfinished(self) -> bool:
        """Whether some request is unfinished or its finishing output has not been returned by
        ``step`` yet."""
        with self._inbox_lock:
            return bool(self._live) or bool(self._pending)

    def _drain(self):
        with self._inbox_lock:
            inbox, self._inbox = self._inbox, []
        for kind, item in inbox:
            if kind == "add":
                self._requests[item.request_id] = item
                self.scheduler.add(item)
            else:
                req = self._requests.get(item)
                if req is not None:
                    self._finish(req, ABORT)

    def running_ids(self) -> set[int]:
        """Ids of the requests that hold pages now (running or prefilling); the others are
        queued. Read without the step lock: a snapshot."""
        return {req.request_id for req in list(self.scheduler.running)}

    def _finish(self, req: Request, reason: str, new_tokens=(), error=None, stop_token=None,
                logprobs=None, prompt_lps=None):
        self.scheduler.finish(req)
        del self._requests[req.request_id]
        req.finish_reason, req.error = reason, error
        hidden, req.hidden = req.hidden, None
        self._pending.append(RequestOutput(
            req.request_id, list(new_tokens), True, reason, error, stop_token, logprobs,
            prompt_lps, req.cached_prompt_tokens,
            None if hidden is None or reason != LENGTH else hidden.float().tolist()))
        with self._inbox_lock:  # after the output is pending: has_unfinished stays true
            self._live.discard(req.request_id)
            self._aborting.discard(req.request_id)

    def _take_outputs(self) -> list[RequestOutput]:
        with self._inbox_lock:
            outputs, self._pending = self._pending, []
        return outputs

    def fail_all(self, error: BaseException | str) -> list[RequestOutput]:
        """Fail every unfinished request (e.g. after an unexpected error of the step loop);
        returns every output not returned yet, theirs included."""
        with self._step_lock:
            self._drain()
            for req in list(self._requests.values()):
                self._finish(req, ERROR, error=str(error))
            if self._inflight is not None:
                self._inflight.wait()  # before its graph or pages can go away
            self._inflight = None
            return self._take_outputs()

    # -- stepping ------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step. Returns one RequestOutput per request that got a token or finished in
        it (requests still prefilling a long prompt may get nothing for a few steps).

        Pipelined (``pipeline``): a step of decode rows is completed (its tokens read back) only
        after the next one is launched, so the GPU runs the next step while the host handles
        this one's tokens; its outputs are then returned one call later than they were made."""
        if self.runtime.cache is not self.cache:  # what is left fails (POOL_GONE)
            return self.fail_all(POOL_GONE)
        with self._step_lock, self.runtime.lock:
            self._drain()
            flight, self._inflight = self._inflight, None
            if flight is None:
                plan = self.scheduler.schedule()
                if not plan:
                    return self._take_outputs()
                flight = self._launch(plan)
                self.steps += 1
                if flight is None:  # the step failed; its requests are failed
                    return self._take_outputs()
            if self.pipeline:
                self._inflight = self._launch_next(flight)
            self._complete(flight)
            if self._inflight is not None and self._inflight.logits is not None:
                self._sample_deferred(self._inflight)
            return self._take_outputs()

    def _launch(self, plan) -> LaunchedStep | None:
        """Run the plan's step and sample its rows on the device (tokens not read back)."""
        reqs = [req for req, _ in plan]
        chunks = [req.next_chunk(n) for req, n in plan]
        starts = [len(req.seq) for req in reqs]
        sampled = [i for i, (req, n) in enumerate(plan) if starts[i] + n == req.num_tokens]
        every_row = [needs_rows(req) for req in reqs]
        try:
            seqs, tokens = [req.seq for req in reqs], sum(n for _, n in plan)
            if any(every_row):  # prompt rows whose logits a request reports
                logits, rows = self.runner.run_rows(seqs, chunks, every_row, tokens)
                collect(reqs, starts, rows)
            else:
                logits = self.runner.run(seqs, chunks, tokens)
            self.runner.keep_hidden_states(reqs, sampled)
            flight = self._sample(reqs, starts, sampled, logits)
        except BaseException as e:
            self._fail_step(reqs, starts, e)
            return None
        for req, chunk in zip(reqs, chunks):
            req.seq.tokens.extend(chunk)
        flight.decode = self.runner.last_static and len(sampled) == len(reqs)
        return flight

    def _launch_next(self, prev: LaunchedStep) -> LaunchedStep | None:
        """The decode step after ``prev``, launched before prev's tokens are read (its input
        ids are prev's samples, on the device), when the scheduler says it is certain to be
        that step; None otherwise, or when pages run out (the scheduler then plans it)."""
        reqs = prev.reqs
        with self._inbox_lock:
            queued = bool(self._inbox)
        if not prev.decode or not self.scheduler.can_pipeline(reqs, queued):
            return None
        starts = [len(req.seq) for req in reqs]
        try:
            logits = self.runner.run_device_ids([req.seq for req in reqs], prev.ids.ids)
            if any(req.sampling.structured for req in reqs):  # sampled once prev's are taken
                flight = LaunchedStep(reqs, starts, [], None, None, logits=logits)
            else:
                flight = self._sample(reqs, starts, list(range(len(reqs))), logits, ahead=1)
        except Exception:  # no room, or a fault: give the pages back, the scheduler decides
            for req, start in zip(reqs, starts):
                self.cache.truncate(req.seq, start)
            return None
        prev.successor = flight
        flight.decode = True
        self.steps += 1
        self.pipelined_steps += 1
        return flight

    def _sample(self, reqs, starts, sampled, logits, ahead: int = 0) -> LaunchedStep:
        """Sample the rows of the requests in ``sampled`` (their k-th token, k = len(output) +
        ahead); the runner starts copying the ids to the host."""
        ids = rows = None
        if sampled:
            rows = logits if len(sampled) == len(reqs) else logits[sampled]
            ids = self.runner.sample_requests(rows, [reqs[i] for i in sampled], ahead)
        return LaunchedStep(reqs, starts, sampled, ids, rows)

    def _sample_deferred(self, flight: LaunchedStep):
        """Sample a pipelined step launched before the tokens ahead of it were committed (its
        grammars' masks need them), for the requests still running: their forward is on the
        device already, so the masks are computed while it runs."""
        logits, flight.logits = flight.logits, None
        running = [i for i, req in enumerate(flight.reqs) if req.state == RUNNING]
        try:
            sampled = self._sample(flight.reqs, flight.starts, running, logits)
        except BaseException as e:
            self._fail_step(flight.reqs, flight.starts, e)
            self._inflight = None
            return
        flight.sampled, flight.ids, flight.rows = sampled.sampled, sampled.ids, sampled.rows

    def _complete(self, flight: LaunchedStep):
        """Read the step's tokens back and have the scheduler commit them. A successor step
        (already running) continues the same requests with these tokens: they join its
        sequences now."""
        reqs, sampled = flight.reqs, flight.sampled
        try:
            ids = [] if flight.ids is None else flight.ids.tolist()
            sums = [] if flight.ids is None else flight.ids.sums()
            lps = sampled_logprobs(flight.rows, [reqs[i] for i in sampled], ids)
        except BaseException as e:
            self._fail_step(reqs, flight.starts, e)
            self._inflight = None  # its successor continued the requests just failed
            return
        next_ids = dict(zip(sampled, ids)) if flight.successor is not None else {}
        for i, req in enumerate(reqs):
            if req.state == RUNNING and i in next_ids:
                req.seq.tokens.append(next_ids[i])  # the token the successor step runs
            self.scheduler.publish(req)
        for j, (i, token) in enumerate(zip(sampled, ids)):
            req = reqs[i]
            if req.state != RUNNING:  # aborted while the step ran
                continue
            problem = non_finite(sums[j], len(req.output), self.model.ops.name)
            if problem is not None:  # NaN or inf in its logits: this request fails alone
                self._finish(req, ERROR, error=problem)
                continue
            prompt_lps = report(req)
            if req.max_new_tokens == 0:  # the prompt only scored: its sampled token is dropped
                self._finish(req, LENGTH, prompt_lps=prompt_lps)
                continue
            reason = self.scheduler.commit(req, token)
            logprobs = None if lps.get(j) is None else [lps[j]]
            if reason == STOP:
                self._finish(req, STOP, stop_token=token, prompt_lps=prompt_lps)
                continue
            self.generated_tokens += 1
            if reason is None and req.sampling.structured:
                verdict = advance_grammar(req, token)
                if verdict is not None and verdict != "done":
                    self._finish(req, ERROR, error=verdict)
                    continue
                reason = STOP if verdict == "done" else None
            if reason is not None:
                self._finish(req, reason, [token], logprobs=logprobs, prompt_lps=prompt_lps)
            else:
                self._pending.append(RequestOutput(req.request_id, [token], logprobs=logprobs,
                                                   prompt_logprobs=prompt_lps,
                                                   cached_tokens=req.cached_prompt_tokens))

    def _fail_step(self, reqs, starts, e: BaseException):
        for req, start in zip(reqs, starts):
            if req.state != FINISHED:
                self.cache.truncate(req.seq, start)  # gives back the step's pages
        if not isinstance(e, Exception):
            raise e
        if isinstance(e, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        message = f"the step failed: {type(e).__name__}: {e}"
        for req in reqs:
            if req.state != FINISHED:
                self._finish(req, ERROR, error=message)

    def warmup(self):
        """Capture the decode steps' CUDA graphs of every batch-size bucket now (a server calls
        it before taking requests); without graphs it does nothing."""
        with self._step_lock, self.runtime.lock:
            if self.runner.graphs:
                self.runner.warmup()
                torch.cuda.synchronize()

    # -- inspection ----------------------------------------------------------------------------

    def stats(self) -> dict:
        """Requests, pages and steps now (``engine_stats``)."""
        return engine_stats(self)

    def check_accounting(self) -> dict:
        """AssertionError unless the pool's references match the requests' pages (see
        ``Scheduler.check_pages``; a ChatSession's pages count as unaccounted); ``stats()``."""
        with self._step_lock:
            self.scheduler.check_pages(self.runner.scratch_page)
            return self.stats()

    def close(self):
        """Fail what is left (their pages go back to the pool); the model's runtime keeps the
        pool and the captured steps for the next engine or generation."""
        if not self.closed:
            self.fail_all("the engine was closed")
            self.closed = True
            self.runtime.engines.discard(self)
