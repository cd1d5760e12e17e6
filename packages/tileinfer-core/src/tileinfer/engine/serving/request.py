"""A request of the serving engine: what was asked, what it produced, where it is in the cache.

A request's tokens are its prompt followed by its output. Its ``seq`` (a cache ``Sequence``, or
None while it holds no pages) caches the keys and values of a prefix of them; the tokens after
that prefix are what it still has to run: part of the prompt while it prefills, the last output
token while it decodes, and after a preemption everything again (minus a cached prefix).

Its k-th output token is sampled from the logits after its first ``len(prompt) + k`` tokens with
the random stream ``(seed, k)``, the stream ``tileinfer.generate`` uses, so the output does not
depend on what else ran in the same steps, on chunking or on preemption.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from ...backend.logit_processing import check_bias_ids
from ...backend.sampling import SamplingParams
from ..arguments import check_seed, token_ids
from ..kv.cache import Sequence

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"
# Why a request finished.
STOP, LENGTH, ABORT, ERROR = "stop", "length", "abort", "error"


class RequestError(ValueError):
    """A request the engine refuses (bad arguments, or too long for the model or the pool)."""


@dataclass
class RequestOutput:
    """What one step did for one request: its new tokens (at most one per step), and whether it
    finished, why, and with what error (finish_reason "error"). stop_token: the stop id that
    ended it (not part of the output, as in ``tileinfer.generate``)."""

    request_id: int
    new_tokens: list[int]
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    stop_token: int | None = None
    # With add_request(logprobs=k): per new token, (its log-probability, the k most likely
    # (id, log-probability) pairs), from the step's raw logits (before temperature etc.).
    logprobs: list | None = None
    # With add_request(prompt_logprobs=k), on its first output: per prompt token, None for the
    # first, then (its log-probability given the tokens before it, the k most likely pairs).
    prompt_logprobs: list | None = None
    # Its prompt tokens whose keys came from the prefix cache (at its first admission).
    cached_tokens: int = 0
    # With add_request(hidden_state=True), on its only output: the prompt's last token's final
    # hidden state (after the final norm: the lm_head's input), as floats (hidden_size,).
    hidden_state: list | None = None


@dataclass(eq=False)
class Request:
    request_id: int
    prompt: list[int]
    sampling: SamplingParams
    max_new_tokens: int
    stop_ids: frozenset
    seed: int
    arrival: int  # order of arrival: first come, first served
    output: list[int] = field(default_factory=list)
    state: str = WAITING
    seq: Sequence | None = None
    page_keys: list = field(default_factory=list)  # prefix-cache keys of seq's full pages
    finish_reason: str | None = None
    error: str | None = None
    preemptions: int = 0
    cached_prompt_tokens: int = 0  # taken from the prefix cache at the first admission
    logprobs: int | None = None  # top log-probabilities to report per token (None: none)
    prompt_logprobs: int | None = None  # top pairs per prompt token (None: none)
    prompt_lps: list = field(default_factory=list)  # entries of prompt tokens 1.. found so far
    prompt_reported: bool = False
    token_counts: object = None  # its penalties' TokenCounts on the device (batch_processing)
    grammar: object = None  # its GrammarMatcher, when it has a structure (batch_grammar)
    min_new_tokens: int = 0  # its stop ids are held back until it has this many tokens
    hidden_state: bool = False  # report its prompt's last final hidden state (no tokens)
    hidden: object = None  # that state, (hidden_size,) on the device, once its last chunk ran

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    @property
    def num_computed(self) -> int:
        return 0 if self.seq is None else len(self.seq)

    @property
    def pending(self) -> int:
        """Tokens still to run before the next output token can be sampled."""
        return self.num_tokens - self.num_computed

    def next_chunk(self, n: int) -> list[int]:
        """The next n tokens to run (after the computed ones)."""
        start, p = self.num_computed, len(self.prompt)
        if start >= p:
            return self.output[start - p:start - p + n]
        return self.prompt[start:start + n] + self.output[:max(0, start + n - p)]


def check_top(name: str, value):
    """RequestError unless value is None or an integer in 0..20 (logprobs, prompt_logprobs)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value <= 20):
        raise RequestError(f"{name} must be None or an integer in 0..20, got {value!r}")


def request_limits(engine) -> dict:
    """The keyword arguments of check_request that an LLMEngine's model and pool set."""
    c = engine.model.config
    return dict(vocab_size=c.vocab_size, max_len=engine.model.max_len,
                page_size=engine.cache.page_size, pool_pages=engine.num_pages,
                default_stop=tuple(c.eos_token_ids))


def check_request(prompt, sampling, max_new_tokens, stop_ids, seed, *, vocab_size: int,
                  max_len: int, page_size: int, pool_pages: int, default_stop,
                  logprobs=None, prompt_logprobs=None, min_new_tokens: int = 0,
                  hidden_state: bool = False) -> dict:
    """Validated, normalized arguments of a request (``LLMEngine.add_request``'s), or
    RequestError saying what is wrong.

    stop_ids: token ids that end it (not part of the output); default the model's EOS ids.
    seed: its random stream (default: a random one); its k-th token is sampled from the stream
    (seed, k), as ``tileinfer.generate(..., seed=seed)`` does.
    logprobs: report each new token's log-probability and the ``logprobs`` most likely tokens'
    (``RequestOutput.logprobs``; 0..20), from the raw logits.
    prompt_logprobs: the same for each prompt token given the ones before it, on the first
    output (``prompt_logprobs.py``); max_new_tokens may then be 0 (finish reason "length").
    min_new_tokens: its stop ids cannot be sampled before it has this many new tokens (vLLM's
    ``min_tokens``; not with a structured output).
    hidden_state: run the prompt only (max_new_tokens 0) and report its last token's final
    hidden state, after the final norm (``RequestOutput.hidden_state``): what an embedding
    model's last-token pooling reads.
    """
    check_top("logprobs", logprobs)
    check_top("prompt_logprobs", prompt_logprobs)
    try:
        prompt = token_ids(prompt, "prompt_ids", vocab_size)
    except (TypeError, ValueError) as e:
        raise RequestError(str(e)) from None
    if not prompt:
        raise RequestError("the prompt needs at least one token")
    if len(prompt) > max_len:
        raise RequestError(f"the prompt has {len(prompt)} tokens; the model's max_len is "
                           f"{max_len}")
    least = 0 if prompt_logprobs is not None or hidden_state else 1
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < least:
        kind = "a positive integer (0 needs prompt_logprobs or hidden_state)" if least else \
            "a non-negative integer"
        raise RequestError(f"max_new_tokens must be {kind}, got {max_new_tokens!r}")
    if hidden_state and max_new_tokens:
        raise RequestError("a hidden_state request only runs its prompt: max_new_tokens must "
                           f"be 0, got {max_new_tokens}")
    if not isinstance(sampling, SamplingParams):
        raise RequestError(f"sampling must be a tileinfer.SamplingParams, got "
                           f"{type(sampling).__name__}")
    try:  # re-validates one built around __post_init__ (e.g. with object.__setattr__)
        sampling = dataclasses.replace(sampling)
        check_bias_ids(sampling, vocab_size)
    except ValueError as e:
        raise RequestError(str(e)) from None
    if isinstance(min_new_tokens, bool) or not isinstance(min_new_tokens, int) \
            or not 0 <= min_new_tokens <= max_new_tokens:
        raise RequestError(f"min_new_tokens must be an integer in 0..max_new_tokens "
                           f"({max_new_tokens}), got {min_new_tokens!r}")
    if min_new_tokens and sampling.structured:
        raise RequestError("min_new_tokens cannot be combined with a structured output: its "
                           "grammar decides where the answer may end")
    try:
        seed = check_seed(seed)
        stop = frozenset(int(i) for i in default_stop) if stop_ids is None else \
            frozenset(token_ids(stop_ids, "stop_ids", vocab_size))
    except (TypeError, ValueError) as e:
        raise RequestError(str(e)) from None
    # Positions it may cache: every token but the last one sampled, within max_len (the whole
    # prompt when it only scores it: its last row runs too).
    positions = min(len(prompt) + max(max_new_tokens, 1) - 1, max_len)
    pages = math.ceil(positions / page_size)
    if pages > pool_pages:
        raise RequestError(
            f"the request needs up to {pages} KV pages ({positions} positions: prompt "
            f"{len(prompt)} + max_new_tokens {max_new_tokens}), the pool has {pool_pages}; "
            f"lower max_new_tokens or give the engine more pages")
    return dict(prompt=prompt, sampling=sampling, max_new_tokens=max_new_tokens,
                stop_ids=stop, seed=seed, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                min_new_tokens=min_new_tokens, hidden_state=bool(hidden_state))
