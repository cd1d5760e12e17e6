"""EngineThread: an ``LLMEngine``'s step loop on a background thread, for servers.

    outputs = {}                                  # e.g. one asyncio.Queue per request
    def on_output(out):                           # called on the engine's thread
        loop.call_soon_threadsafe(outputs[out.request_id].put_nowait, out)
    runner = EngineThread(engine, on_output).start()
    rid = runner.add_request(ids, sampling, max_new_tokens=256)   # from any thread
    runner.abort(rid)
    runner.stop()

The thread steps while some request is unfinished and sleeps on an event otherwise; adding or
aborting a request wakes it. ``on_output`` must be quick and must not call the engine's ``step``
(it runs inside the loop); an exception it raises is kept in ``loop_errors``. If a step raises
an unexpected error (the engine already turns errors of the forward pass into failed
requests), every unfinished request is failed with it and the loop goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .request import RequestOutput


class EngineThread:
    def __init__(self, engine, on_output: Callable[[RequestOutput], None],
                 idle_wait: float = 0.05):
        self.engine, self.on_output, self.idle_wait = engine, on_output, idle_wait
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.loop_errors: list[BaseException] = []

    def start(self) -> "EngineThread":
        if self._thread is not None:
            raise RuntimeError("the engine thread is already started")
        self._thread = threading.Thread(target=self._loop, name="tileinfer-engine", daemon=True)
        self._thread.start()
        return self

    def add_request(self, *args, **kwargs) -> int:
        """``LLMEngine.add_request`` (RequestError raised here, in the caller's thread)."""
        rid = self.engine.add_request(*args, **kwargs)
        self._wake.set()
        return rid

    def abort(self, request_id: int) -> bool:
        done = self.engine.abort(request_id)
        self._wake.set()
        return done

    def stop(self, timeout: float | None = None):
        """End the loop (unfinished requests stay in the engine) and wait for the thread."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self):
        while not self._stopping:
            self._wake.clear()
            if not self.engine.has_unfinished():
                self._wake.wait(self.idle_wait)
                continue
            for out in step_or_fail(self.engine, self.loop_errors):
                try:
                    self.on_output(out)
                except Exception as e:  # the callback's fault: keep serving the others
                    self.loop_errors.append(e)


def step_or_fail(engine, errors: list) -> list[RequestOutput]:
    """``engine.step()``; if it raises an unexpected error (the engine already turns errors of
    the forward pass into failed requests), the error goes to errors and every unfinished
    request is failed with it."""
    try:
        return engine.step()
    except Exception as e:  # a bug, not a failing forward
        errors.append(e)
        return engine.fail_all(f"the engine's step failed: {type(e).__name__}: {e}")
