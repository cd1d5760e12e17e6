"""ChatSession: a conversation with a model that reuses the KV cache of the prefix a turn shares.

Each turn renders the whole conversation with the model's chat template, tokenizes it, and keeps
the cached positions of the longest common prefix of those ids and the cached ones (rolling the
cache back to it with ``truncate``); only the rest is prefilled. A turn that fails (out of pages,
a prompt too long, an interrupt) leaves the conversation and the cache exactly as they were: the
positions dropped to reach the common prefix are recomputed.

A session is one conversation and one cache: it serves one turn at a time. A ``reply`` (or
``reset``) while another thread is inside one raises ``ChatSessionBusyError`` at once and changes
nothing; use one session per thread.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

from ...backend.sampling import SamplingParams
from ...io.chat_template import ChatMessage, chat_prompt
from ..arguments import check_seed, token_ids
from ..kv.cache import common_prefix_len
from ..runtime.runtime import runtime_of
from .generate import generate_into
from .runner import runner_for
from .speculative.proposer import SpecStats, check_proposer


@dataclass
class TurnStats:
    """One chat turn: prompt tokens reused from the cache, prefilled, and tokens generated;
    with speculative decoding, its steps and drafts (``spec``, else None)."""

    reused: int
    prefilled: int
    generated: int
    seconds: float
    spec: SpecStats | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.seconds if self.seconds > 0 else float("nan")


class PromptTooLongError(ValueError):
    """The conversation no longer fits the session's KV cache."""


class ChatSessionBusyError(RuntimeError):
    """The session is serving a turn in another thread."""


class ChatSession:
    """A conversation with ``model`` of up to ``max_tokens`` positions, its keys and values in
    pages of the model's shared KV pool (``runtime_of(model).cache``), which grows to have room
    for it when made. The pages stay held until ``close()`` or ``reset()``; another user of the
    pool (an ``LLMEngine``) may take the free pages meanwhile, and a turn then fails with
    ``OutOfPagesError``, leaving the conversation as it was.

    template: a model folder or template source for ``chat_prompt`` (default: the model's folder).
    kv_cache: None (model dtype) or "int8", with optional per-layer ``key_smoothing`` factors
    (``tileinfer.calibrate_key_smoothing``). stop_ids default to the model's EOS ids.
    speculative: a proposer for speculative decoding (see ``tileinfer.speculative``).
    """

    def __init__(self, model, tokenizer, sampling: SamplingParams = SamplingParams(),
                 stop_ids=None, enable_thinking: bool | None = None, max_tokens: int | None = None,
                 kv_cache: str | None = None, key_smoothing=None, seed: int | None = None, system: str | None = None,
                 template: str | Path | None = None, graphs: bool | None = None, page_size: int = 16,
                 speculative=None):
        self.model, self.tokenizer, self.sampling = model, tokenizer, sampling
        self.stop_ids = list(model.config.eos_token_ids) if stop_ids is None else \
            token_ids(stop_ids, "stop_ids", model.config.vocab_size)
        self.enable_thinking = enable_thinking
        if max_tokens is not None and (isinstance(max_tokens, bool)
                                       or not isinstance(max_tokens, int) or max_tokens < 1):
            raise ValueError(f"max_tokens must be None or an integer >= 1, got {max_tokens!r}")
        self.max_tokens = model.max_len if max_tokens is None else max_tokens
        if self.max_tokens > model.max_len:
            raise ValueError(f"max_tokens {self.max_tokens} exceeds the model's max_len {model.max_len}")
        self.template = template if template is not None else model.model_dir
        if self.template is None:
            raise ValueError("this model has no folder to read a chat template from; pass template=")
        self.seed = seed if seed is None else check_seed(seed)
        check_proposer(speculative)
        self.speculative = speculative
        self.turns = 0
        self._busy = threading.Lock()
        self._pool_args = (graphs, page_size, kv_cache, key_smoothing)
        self._attach()
        self.system = system
        self.messages: list[ChatMessage] = []
        self._reset()

    def _attach(self):
        """Take the runner and an empty sequence from the model's runtime: when made, and for
        the turn after ``model.close()`` (whose runtime let the pool go), which computes the
        whole conversation again."""
        graphs, page_size, kv_cache, key_smoothing = self._pool_args
        runtime = runtime_of(self.model)
        with runtime.lock:  # the conversation's pages come from the model's shared KV pool
            self.runner = runner_for(self.model, graphs, page_size=page_size,
                                     kv_quantize=kv_cache, key_smoothing=key_smoothing)
            runtime.reserve_room(math.ceil(self.max_tokens / page_size))
        self.seq = self.cache.new_sequence()
        # A session dropped without close() gives its pages back when it is collected.
        self._finalizer = weakref.finalize(self, _release, self.runner, self.seq)

    @property
    def cache(self):
        """The model's KV pool, where the conversation's pages live."""
        return self.runner.cache

    def close(self):
        """Give the conversation's pages back to the pool (a later turn starts afresh)."""
        with self._turn():
            self._reset()

    @contextlib.contextmanager
    def _turn(self):
        """The session's lock, taken without waiting: a second thread gets a clear error."""
        if not self._busy.acquire(blocking=False):
            raise ChatSessionBusyError(
                "this ChatSession is serving a turn in another thread; a session holds one "
                "conversation and serves one turn at a time (use one session per thread)")
        try:
            yield
        finally:
            self._busy.release()

    def reset(self):
        """Clear the conversation (keeping the system message) and free its cache pages."""
        with self._turn():
            self._reset()

    def _reset(self):
        with self.runner.lock:
            _release(self.runner, self.seq)
        self.messages = [ChatMessage("system", self.system)] if self.system else []

    def prompt_ids(self, messages) -> list[int]:
        kwargs = {}
        if self.enable_thinking is not None:
            kwargs["enable_thinking"] = self.enable_thinking
        text = chat_prompt(self.template, messages, add_generation_prompt=True, **kwargs)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def reply(self, text: str, max_new_tokens: int = 1024, on_token=None) -> tuple[str, TurnStats]:
        """Add the user message ``text``, generate the reply, add it to the conversation.
        Raises ``ChatSessionBusyError`` if another thread is inside a turn of this session."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        with self._turn():
            if self.runner.cache is None:  # the model was closed since the last turn
                self._finalizer.detach()
                self._attach()
            with self.runner.lock:
                return self._reply(text, max_new_tokens, on_token)

    def _reply(self, text, max_new_tokens, on_token):
        messages = self.messages + [ChatMessage("user", text)]
        ids = self.prompt_ids(messages)
        if len(ids) + 1 > self.max_tokens:
            raise PromptTooLongError(
                f"the conversation is {len(ids)} tokens, the session holds {self.max_tokens}; "
                "reset it or start a session with a larger max_tokens")
        max_new_tokens = min(max_new_tokens, self.max_tokens - len(ids))
        cached = list(self.seq.tokens)
        # Keep at least one token to run: its logits give the first reply token.
        reused = min(common_prefix_len(cached, ids), len(ids) - 1)
        start = time.perf_counter()
        self.cache.truncate(self.seq, reused)
        seed = self.turn_seed()
        spec = SpecStats() if self.speculative is not None else None
        try:
            new = generate_into(self.runner, self.seq, ids[reused:], max_new_tokens, self.sampling,
                                self.stop_ids, seed, on_token, speculative=self.speculative,
                                spec_stats=spec)
        except BaseException:
            self._restore(cached, reused)
            raise
        seconds = time.perf_counter() - start
        reply = self.tokenizer.decode(new, skip_special_tokens=True)
        self.messages = messages + [ChatMessage("assistant", reply)]
        self.turns += 1
        return reply, TurnStats(reused, len(ids) - reused, len(new), seconds, spec)

    def turn_seed(self) -> int | None:
        """The seed of the next turn's sampler: the session's seed plus the turns before it,
        wrapped into the int64 range (None without a seed)."""
        if self.seed is None:
            return None
        return (self.seed + self.turns + 2**63) % 2**64 - 2**63

    def _restore(self, cached, reused):
        """Bring the cache back to ``cached`` after a failed turn (recomputing dropped positions)."""
        self.cache.truncate(self.seq, reused)
        if len(cached) > reused:
            self.runner.forward(self.seq, cached[reused:])


def _release(runner, seq):
    """Give seq's pages back to the runner's pool (none left if the model was closed)."""
    if runner.cache is not None and seq.pages:
        runner.cache.release(seq)
    del seq.tokens[:]
