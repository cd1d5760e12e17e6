"""EngineProcess: an ``LLMEngine`` built and stepped in a process of its own, with
``EngineThread``'s interface, for servers.

    process = EngineProcess(build, (folder,)).start()   # build(folder) -> EngineParts, in the child
    process.start_outputs(on_output)                    # on_output(out): on a reader thread
    rid = process.add_request(ids, sampling, max_new_tokens=256)   # from any thread
    process.abort(rid)
    process.stats(), process.running_ids()              # as of the child's last report
    process.stop()

Why: on a thread, the engine's step loop shares the interpreter with the server's HTTP side
(parsing, templates, detokenizing, streaming), and each waits for the GIL the other holds; with
hundreds of streams that slows every step. In a process of its own the engine steps as it does
offline (vLLM's engine core runs in a process for the same reason).

The child is started with "spawn" (a clean interpreter: CUDA cannot be used in a forked child of
a process that has used it) and calls ``build(*args)``, which loads the model and returns the
engine, warmed up, in ``EngineParts``; it reports the engine's limits and stats, then loops: it
takes every command waiting in its pipe, steps while a request is unfinished and sends each
step's outputs with the engine's stats in one message, and blocks on the pipe when idle. It
ignores SIGINT (a Ctrl-C in a terminal reaches the whole process group; the parent decides when
the engine stops) and ends when told to or when the pipe closes (the parent is gone).

The parent checks each request as ``LLMEngine.add_request`` does (``check_request``, with the
child engine's ``request_limits``; the child queues it with ``add_checked``), so a RequestError
is raised at once in the caller's thread; then it numbers the request and queues it for a
sender thread (the caller, a server's event loop, never waits for the child to read a long
prompt). A reader thread receives the child's messages and
hands each output to ``on_output``. ``stats()["waiting"]`` counts the requests sent that the
child has not taken yet. If the child dies, every unfinished request is failed (finish reason
"error") and further requests are refused with ``EngineGone``.

A grammar (``SamplingParams.structure``) travels as its compiled text; the child binds it to
llguidance's view of its own tokenizer (``EngineParts.tokenizer``).
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .engine_thread import step_or_fail
from .request import RequestOutput, check_request, request_limits

START_TIMEOUT_S = 900.0  # loading a large model from a slow disk, compiling kernels


class EngineGone(RuntimeError):
    """The engine's process has ended: no request can be taken."""


@dataclass
class EngineParts:
    """What the child's build gives: the engine (warmed up) and the tokenizer its grammars are
    for (None: requests with a grammar fail), and info for the parent (e.g. the backend's name:
    picklable values)."""

    engine: object
    tokenizer: object = None
    info: dict = dataclasses.field(default_factory=dict)


class EngineProcess:
    def __init__(self, build: Callable[..., EngineParts], args: tuple = ()):
        self.build, self.args = build, args
        self.info: dict = {}
        self.limits: dict = {}
        self.on_output: Callable[[RequestOutput], None] | None = None
        self._conn = self._process = self._reader = None
        self._ids = itertools.count()
        self._id_lock = threading.Lock()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # commands for the sender thread
        self._sender = None
        self._live: set[int] = set()  # sent and not finished
        self._sent = 0  # add commands sent
        self._report: dict = {}  # the child's last stats
        self._running: frozenset = frozenset()
        self._gone: str | None = None  # why the child ended, once it has
        self._stopping = False
        self.loop_errors: list[BaseException] = []

    # -- life -----------------------------------------------------------------------------------

    def start(self) -> "EngineProcess":
        """Start the child and wait until its engine is built (RuntimeError with the child's
        error if the build fails)."""
        context = multiprocessing.get_context("spawn")
        self._conn, child_end = context.Pipe()
        self._process = context.Process(target=_serve, args=(child_end, self.build, self.args),
                                        name="tileinfer-engine", daemon=True)
        self._process.start()
        child_end.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self._kill()
            raise RuntimeError(f"the engine process did not start in {START_TIMEOUT_S:g} s")
        try:
            message = self._conn.recv()
        except EOFError:
            self._kill()
            raise RuntimeError(f"the engine process ended while starting (exit code "
                               f"{self._process.exitcode})") from None
        if message[0] == "failed":
            self._kill()
            raise RuntimeError(message[1])
        _, self.limits, self.info, self._report = message
        self._sender = threading.Thread(target=self._send_all, name="tileinfer-engine-sender",
                                        daemon=True)
        self._sender.start()
        return self

    def start_outputs(self, on_output: Callable[[RequestOutput], None]) -> "EngineProcess":
        """Hand every output to on_output from now on (on a reader thread)."""
        self.on_output = on_output
        self._reader = threading.Thread(target=self._read, name="tileinfer-engine-reader",
                                        daemon=True)
        self._reader.start()
        return self

    def stop(self, timeout: float | None = None):
        """End the child (its engine fails what is left) and wait for it."""
        self._stopping = True
        self._outbox.put(("stop",))  # wakes the sender even when the child is gone
        if self._sender is not None:
            self._sender.join(timeout)
        if self._process is not None:
            self._process.join(timeout)
            if self._process.is_alive():
                self._kill()
        if self._reader is not None:
            self._reader.join(timeout)

    def close(self):
        """The engine's close(): the child closes its engine when it stops."""
        self.stop(timeout=30)

    def _kill(self):
        self._process.kill()
        self._process.join()

    # -- requests -------------------------------------------------------------------------------

    def add_request(self, prompt_ids, sampling=None, max_new_tokens: int = 256, stop_ids=None,
                    seed: int | None = None, logprobs: int | None = None,
                    prompt_logprobs: int | None = None, min_new_tokens: int = 0,
                    hidden_state: bool = False) -> int:
        """``LLMEngine.add_request`` (RequestError raised here, in the caller's thread)."""
        from ...backend.sampling import SamplingParams

        args = check_request(prompt_ids, SamplingParams() if sampling is None else sampling,
                             max_new_tokens, stop_ids, seed, **self.limits, logprobs=logprobs,
                             prompt_logprobs=prompt_logprobs, min_new_tokens=min_new_tokens,
                             hidden_state=hidden_state)
        structure = args["sampling"].structure
        if structure is not None:  # llguidance's tokenizer stays here; the child has its own
            args["sampling"] = dataclasses.replace(
                args["sampling"], structure=dataclasses.replace(structure, tokenizer=None))
        with self._id_lock:
            rid = next(self._ids)
            self._live.add(rid)
            self._sent += 1
        self._send(("add", rid, args))
        return rid

    def abort(self, request_id: int) -> bool:
        if request_id not in self._live:
            return False
        self._send(("abort", request_id))
        return True

    def _send(self, message):
        """Queue a command for the sender thread (a large prompt's bytes never wait in the
        caller's thread, the server's event loop, for the child to read them)."""
        if self._gone is not None:
            raise EngineGone(self._gone)
        self._outbox.put(message)

    def _send_all(self):
        while True:
            message = self._outbox.get()
            try:
                self._conn.send(message)
            except (OSError, EOFError):  # the child is gone: the reader fails what is left
                return
            if message[0] == "stop":
                return

    # -- inspection -----------------------------------------------------------------------------

    def stats(self) -> dict:
        """The engine's ``stats()`` as of the child's last message; "waiting" also counts the
        requests sent that it had not taken then."""
        report = dict(self._report)
        report["waiting"] = report.get("waiting", 0) + self._sent - report.get("taken", 0)
        return report

    def running_ids(self) -> frozenset:
        return self._running

    # -- the reader thread ----------------------------------------------------------------------

    def _read(self):
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            kind = message[0]
            if kind == "closed":
                break
            self._report, self._running = message[2], message[3]
            for out in message[1]:
                if out.finished:
                    self._live.discard(out.request_id)
                try:
                    self.on_output(out)
                except Exception as e:  # the callback's fault: keep serving the others
                    self.loop_errors.append(e)
        self._gone = "the engine process has ended"
        if not self._stopping:
            for rid in sorted(self._live):
                self._live.discard(rid)
                self.on_output(RequestOutput(rid, [], finished=True, finish_reason="error",
                                             error="the engine process ended"))


# -- the child ------------------------------------------------------------------------------------


def _serve(conn, build, args):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        parts = build(*args)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("failed", f"the engine could not be built: {type(e).__name__}: {e}"))
        return
    engine = parts.engine
    child = _Child(conn, parts)
    conn.send(("ready", request_limits(engine), parts.info, child.report()))
    try:
        child.loop()
    finally:
        engine.close()
    try:
        conn.send(("closed",))
    except OSError:
        pass


class _Child:
    """The child's loop: commands in, steps, outputs out (request ids are the parent's)."""

    def __init__(self, conn, parts: EngineParts):
        self.conn, self.engine, self.tokenizer = conn, parts.engine, parts.tokenizer
        self.engine_id: dict[int, int] = {}  # the parent's id -> the engine's
        self.parent_id: dict[int, int] = {}  # the engine's id -> the parent's
        self.taken = 0  # add commands taken

    def report(self) -> dict:
        return dict(self.engine.stats(), taken=self.taken)

    def loop(self):
        engine = self.engine
        while True:
            try:
                if not engine.has_unfinished():
                    self.conn.poll(None)  # idle: wait for a command
                failed = []
                while self.conn.poll():
                    message = self.conn.recv()
                    if message[0] == "stop":
                        return
                    failed += self.take(message)
            except (EOFError, OSError):  # the parent is gone
                return
            stepped = step_or_fail(engine, []) if engine.has_unfinished() else []
            for out in stepped:
                rid = self.parent_id[out.request_id]
                if out.finished:
                    del self.parent_id[out.request_id], self.engine_id[rid]
                out.request_id = rid
            outputs = failed + stepped
            running = frozenset(self.parent_id.get(i, i) for i in engine.running_ids())
            try:
                self.conn.send(("out", outputs, self.report(), running))
            except (EOFError, OSError):
                return

    def take(self, message) -> list[RequestOutput]:
        """One add or abort command; a failed add's output."""
        kind, rid = message[0], message[1]
        if kind == "abort":
            if rid in self.engine_id:
                self.engine.abort(self.engine_id[rid])
            return []
        self.taken += 1
        args = message[2]
        try:
            sampling = args["sampling"]
            if sampling.structure is not None:
                args["sampling"] = dataclasses.replace(
                    sampling, structure=self._local(sampling.structure))
            eid = self.engine.add_checked(args)  # the parent checked it with this engine's limits
        except (ValueError, ImportError) as e:  # the grammar could not be bound here
            return [RequestOutput(rid, [], finished=True, finish_reason="error", error=str(e))]
        self.engine_id[rid], self.parent_id[eid] = eid, rid
        return []

    def _local(self, grammar):
        from ...backend.grammar import ll_tokenizer

        if self.tokenizer is None:
            raise ValueError("this engine process has no tokenizer for grammars")
        return dataclasses.replace(grammar, tokenizer=ll_tokenizer(self.tokenizer))
