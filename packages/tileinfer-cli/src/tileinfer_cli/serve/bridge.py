"""The engine's step loop (in its own process, or on a thread), and the asyncio loop's side of it.

The engine steps in an ``EngineProcess`` (whose reader thread hands over its outputs) or on an
``EngineThread``; its ``on_output`` callback only timestamps each output
and appends it to a deque, and asks the loop (``call_soon_threadsafe``) to flush once for however
many outputs arrive before the loop gets to it: one wake-up per engine step at most, fewer when
the loop is busy. The step loop never waits for the HTTP side. On the loop, ``_flush`` gives each
output to its job (detokenizing, stop strings) and lets every job touched publish one event:
each stream sends its new text once per flush. Detokenizing on the loop's thread lets it overlap
the next step while that step waits for the GPU (PyTorch releases the GIL then).

Admission: a request is refused with 429 (``Retry-After``) when the engine's waiting requests
plus its choices exceed ``max_queue``; a request still waiting (not yet running in the engine)
after ``queue_timeout`` seconds is failed with 503 and removed. Aborting a request frees its
pages at once, or at the end of the step that is running.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time

from .errors import APIError, bad_request, redact

SWEEP_SECONDS = 0.25
STEP_GAP = 0.0005  # seconds between two outputs that are taken for two steps' outputs
log = logging.getLogger("tileinfer.serve")


class EngineBridge:
    def __init__(self, engine, metrics, max_queue: int, queue_timeout: float | None):
        self.engine, self.metrics = engine, metrics
        self.max_queue, self.queue_timeout = max_queue, queue_timeout
        self.thread = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._outbox: collections.deque = collections.deque()
        self._flush_pending = False
        self._choices: dict[int, object] = {}  # engine request id -> Choice
        self.jobs: set = set()  # not ended
        self._sweeper: asyncio.Task | None = None
        self._last_output = self._step_began = 0.0  # the engine thread's, as perf_counter

    def start(self, loop: asyncio.AbstractEventLoop):
        from tileinfer import EngineProcess, EngineThread

        self.loop = loop
        if isinstance(self.engine, EngineProcess):  # it steps in its own process
            self.thread = self.engine.start_outputs(self._on_output)
        else:
            self.thread = EngineThread(self.engine, self._on_output).start()
        self._sweeper = loop.create_task(self._sweep())

    def stop(self):
        """Fail what is left, stop the thread and close the engine (frees its pages)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for job in list(self.jobs):
            job.fail(APIError(503, "the server is shutting down", "server_error"), "abort")
        if self.thread is not None:
            self.thread.stop(timeout=30)
        self.engine.close()

    # -- the engine's thread --------------------------------------------------------------------

    def _on_output(self, out):
        # The thread hands over a step's outputs back to back, then starts the next step: an
        # output that comes STEP_GAP after the one before is the first of a step, which began
        # about when the one before came (the start of a request's step: metrics' queue time).
        t = time.perf_counter()
        if t - self._last_output > STEP_GAP:
            self._step_began = self._last_output
        self._last_output = t
        self._outbox.append((t, self._step_began, out))
        if not self._flush_pending:
            self._flush_pending = True
            try:
                self.loop.call_soon_threadsafe(self._flush)
            except RuntimeError:  # the loop is closed: the server is going away
                pass

    # -- the loop's thread ----------------------------------------------------------------------

    def _flush(self):
        self._flush_pending = False  # before draining: an output appended now gets a flush
        outbox, choices, touched = self._outbox, self._choices, {}
        while outbox:
            t, began, out = outbox.popleft()
            choice = choices.get(out.request_id)
            if choice is not None:
                try:
                    choice.job.on_output(choice, out, t, began)
                except Exception as e:  # a bug: fail this request, not the others
                    log.exception("handling the output of %s", choice.job.id)
                    choice.job.fail(APIError(500, f"internal error: {type(e).__name__}: "
                                             f"{redact(str(e))}", "server_error"), "error")
                touched[choice.job] = None
        for job in touched:
            job.publish()

    def check_capacity(self, n: int):
        deferred = sum(j.deferred for j in self.jobs)
        waiting = self.engine.stats()["waiting"] + deferred
        if waiting + n > self.max_queue:
            self.metrics.outcome("rejected")
            raise APIError(429, f"the server's queue is full ({waiting} requests waiting, the "
                           f"limit is {self.max_queue}); retry later", "rate_limit_error",
                           code="queue_full", headers={"Retry-After": "1"})

    def submit(self, job):
        """Add each prompt's first choice (all the choices when n == 1); RequestError -> 400,
        an ended engine process -> 503."""
        from tileinfer import EngineGone, RequestError

        added = []
        for leader in job.leaders:
            try:
                leader.rid = self.thread.add_request(**job.engine_args(leader))
            except EngineGone as e:
                for choice in added:
                    self.forget(choice, abort=True)
                self.metrics.outcome("error")
                raise APIError(503, f"the engine is not running: {e}", "server_error") from None
            except RequestError as e:
                for choice in added:
                    self.forget(choice, abort=True)
                self.metrics.outcome("invalid")
                raise bad_request(redact(str(e)),
                                  "max_tokens" if "max_new_tokens" in str(e) else None)
            self._choices[leader.rid] = leader
            added.append(leader)
        self.jobs.add(job)
        self.metrics.prompt_tokens += job.plan.prompt_tokens

    def add_choices(self, job, choices):
        """The other choices of a prompt whose first choice's prompt is now cached."""
        from tileinfer import EngineGone, RequestError

        job.deferred -= len(choices)
        for choice in choices:
            try:
                choice.rid = self.thread.add_request(**job.engine_args(choice))
            except (RequestError, EngineGone) as e:  # as the first choice's, so not expected
                job.fail(APIError(500, f"choice {choice.index} was refused: {redact(str(e))}",
                                  "server_error"), "error")
                return
            self._choices[choice.rid] = choice

    def forget(self, choice, abort: bool):
        """Stop routing the choice's outputs; abort its engine request (frees its pages)."""
        if choice.rid is None:
            return
        self._choices.pop(choice.rid, None)
        if abort:
            from tileinfer import EngineGone

            try:
                self.thread.abort(choice.rid)
            except EngineGone:  # an ended engine process has nothing left to abort
                pass

    def job_ended(self, job):
        self.jobs.discard(job)

    async def _sweep(self):
        """Fail the requests that waited too long for the engine to take them."""
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            if not self.queue_timeout:
                continue
            now = time.perf_counter()
            old = [job for job in self.jobs
                   if not job.started and now - job.arrival > self.queue_timeout]
            if not old:
                continue
            # Requests in the engine's running list hold pages (prefilling a long prompt
            # counts as running); the others are still queued. A copy of the list, read
            # without the engine's lock: a request that starts now is caught next time.
            running = self.engine.running_ids()
            for job in old:
                if job.choices[0].rid not in running:
                    job.fail(APIError(503, f"the request waited {now - job.arrival:.1f} s in "
                                      f"the queue (the limit is {self.queue_timeout:g} s)",
                                      "server_error", code="queue_timeout",
                                      headers={"Retry-After": "1"}), "queue_timeout")
