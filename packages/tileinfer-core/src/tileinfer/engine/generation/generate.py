"""Token generation: plain step-by-step decoding and pipelined decoding.

Every token is sampled by the backend's ``sample_tokens`` op from the stream (seed, k) for the
k-th new token, so the result is a function of the logits and one seed whichever path runs it:
``tileinfer.sampling.sample_host(logits, params, seed, k)`` picks the same token.

Logit bias, penalties and min_p (``SamplingParams``) are applied on the device before the
sampling op, with the sequence's token counts kept on the device and updated by each sampling
step (``sequence_processing.py``), so pipelined decoding and CUDA graphs run them as they run
the rest; ``sample_host(..., prompt=, output=)`` gives the same tokens, the prompt being all the
sequence holds before the output. Speculative decoding does not take them.

A grammar (``SamplingParams.structure``, structured outputs) is read on the host at every
token: before each step the matcher's bitmask of allowed tokens goes to the device, where the
sampled row's disallowed logits become -inf; after it the matcher takes the token. Such a
generation runs step by step (not pipelined, not speculative) and ends at a stop token, which
the mask allows only where the grammar accepts, or when the grammar allows nothing more.

Pipelined decoding (CUDA graphs on a CUDA device): each step's sampled token is written on the
device into the next step's input, and copied to pinned host memory asynchronously. The host
launches step k + 1 before it reads token k, so the GPU never waits for Python; when token k turns
out to be a stop token (or the last one asked for), the one step launched past it is rolled back
with ``truncate``. Afterwards the sequence holds the input ids and every generated token except
the last, exactly as in plain decoding.

Speculative decoding (``speculative=`` a proposer, see ``tileinfer.engine.generation.speculative``) checks
several drafted tokens per target step instead; with n-gram drafts it is pipelined the same way
(``tileinfer.engine.generation.speculative.pipelined``) and drafts only while drafts are accepted; its stream
usage is described in ``tileinfer.engine.generation.speculative.decode``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ...backend.sampling import SamplingParams
from ..arguments import check_seed, token_ids
from ..runtime.runtime import runtime_of
from .runner import ModelRunner, runner_for
from .speculative.decode import generate_speculative
from .speculative.proposer import Proposer, SpecStats, check_proposer


def _check_args(model, max_new_tokens, sampling, seed, pipeline, speculative) -> int:
    """Refuse bad arguments before anything runs; returns the seed (a random one for None)."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) \
            or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    if not isinstance(sampling, SamplingParams):
        raise TypeError("sampling must be a tileinfer.SamplingParams")
    if pipeline and torch.device(model.device).type != "cuda":
        raise ValueError("pipelined decoding (pipeline=True) needs a model on a CUDA device")
    check_proposer(speculative)
    return check_seed(seed)


def _input_ids(model, ids, name: str) -> list[int]:
    ids = token_ids(ids, name, model.config.vocab_size)
    if not ids:
        raise ValueError("generate needs at least one input token")
    return ids


def _stop_ids(model, stop_ids) -> set[int]:
    if stop_ids is None:
        return set(model.config.eos_token_ids)
    return set(token_ids(stop_ids, "stop_ids", model.config.vocab_size))


def generate_into(runner: ModelRunner, seq, ids, max_new_tokens: int = 256,
                  sampling: SamplingParams = SamplingParams(), stop_ids: Iterable[int] | None = None,
                  seed: int | None = None, on_token: Callable[[int], None] | None = None,
                  pipeline: bool | None = None, speculative: Proposer | None = None,
                  spec_stats: SpecStats | None = None) -> list[int]:
    """Continue ``seq`` with ``ids`` and generate up to ``max_new_tokens`` tokens.

    Returns the new token ids without the stop token. ``on_token(id)`` is called for each new
    token as soon as the host knows it. ``stop_ids`` defaults to the model's EOS ids. ``pipeline``
    defaults to on when the runner uses CUDA graphs (True needs a model on a CUDA device). Bad
    arguments (ids or stop ids that are not token ids of the vocabulary, a seed outside int64)
    are refused before anything runs; on an error while it runs (e.g. the cache runs out of
    pages) the sequence is rolled back to where it was and the error re-raised.

    speculative: a proposer (``NgramProposer``, ``DraftProposer``, ``DFlashProposer``) whose
    drafts the model checks several per step (``pipeline`` does not apply: n-gram drafts always
    run pipelined, the others step by step); ``spec_stats``, a ``SpecStats``, counts its steps
    and drafts.
    """
    seed = _check_args(runner.model, max_new_tokens, sampling, seed, pipeline, speculative)
    ids = _input_ids(runner.model, ids, "ids")
    if speculative is not None and sampling.processes_logits:
        raise ValueError("speculative decoding does not take logit bias, penalties or min_p: "
                         "generate without a proposer")
    if speculative is not None and sampling.structured:
        raise ValueError("speculative decoding does not take a grammar (structure): generate "
                         "without a proposer")
    stop = _stop_ids(runner.model, stop_ids)
    if pipeline is None:
        pipeline = runner.graphs
    with runner.lock:
        start = len(seq)
        # A proposer may have the runner write hidden states (DFlash): on the model runtime's
        # shared runner only for this generation (a runner of the caller's own keeps them).
        hidden = runner.hidden_layers, runner.step_listener
        try:
            if speculative is not None:  # sets up the stream (seed, counter) itself
                return generate_speculative(runner, seq, ids, speculative, max_new_tokens,
                                            sampling, stop, seed, on_token, spec_stats)
            runner.seed.fill_(seed)
            runner.counter.zero_()
            runner.begin_sampling(sampling, seq.tokens + ids, stop)
            loop = _pipelined if pipeline and not sampling.structured else _stepwise
            return loop(runner, seq, ids, max_new_tokens, sampling, stop, on_token)
        except BaseException:
            runner.cache.truncate(seq, start)
            raise
        finally:
            if getattr(runner, "runtime", None) is not None:
                runner.hidden_layers, runner.step_listener = hidden


def _stepwise(runner, seq, ids, max_new_tokens, sampling, stop, on_token):
    new: list[int] = []
    pending = ids
    grammar = runner.grammar if sampling.structured else None
    while True:
        if grammar is not None:
            grammar.load_mask()
        runner.forward(seq, pending, sampling)
        token = int(runner.next_token[0])  # waits for the step
        runner.check_finite(float(runner.logit_sum[0]), len(new))
        if token in stop:
            break
        if grammar is not None and not grammar.matcher.advance(token):
            raise RuntimeError(f"the grammar rejected token {token} at output token {len(new)}: "
                               f"{grammar.matcher.error}")
        new.append(token)
        if on_token is not None:
            on_token(token)
        if len(new) == max_new_tokens or (grammar is not None and grammar.matcher.done):
            break
        pending = [token]
    return new


def _pipelined(runner, seq, ids, max_new_tokens, sampling, stop, on_token):
    device_token = runner.next_token
    host_tokens = torch.empty(max_new_tokens + 1, dtype=torch.int32, pin_memory=True)
    host_sums = torch.empty(max_new_tokens + 1, dtype=torch.float32, pin_memory=True)
    events = []

    def launch_copy(k):
        host_tokens[k : k + 1].copy_(device_token, non_blocking=True)
        host_sums[k : k + 1].copy_(runner.logit_sum, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        events.append(event)

    runner.forward(seq, ids, sampling)  # prefill; samples token 0 on the device
    launch_copy(0)
    base = len(seq)  # positions of generated tokens start here
    new: list[int] = []
    k = 0  # the token the host reads next
    while True:
        if k + 1 < max_new_tokens:
            # Step k + 1 consumes token k straight from the device, before the host knows it.
            runner.decode_from_device(seq, sampling)
            launch_copy(k + 1)
        events[k].synchronize()
        token = int(host_tokens[k])
        runner.check_finite(float(host_sums[k]), k)
        if token in stop:
            break
        new.append(token)
        if k + 1 < max_new_tokens:  # step k + 1 ran with token k: replace its placeholder
            seq.tokens[base + k] = token
        if on_token is not None:
            on_token(token)
        if len(new) == max_new_tokens:
            break
        k += 1
    # Token k was the last: it is never run, and any step launched with it is rolled back.
    torch.cuda.current_stream().synchronize()
    runner.cache.truncate(seq, base + k)
    return new


def generate(model, prompt_ids, max_new_tokens: int = 256, sampling: SamplingParams = SamplingParams(),
             stop_ids=None, seed: int | None = None, on_token=None, pipeline: bool | None = None,
             graphs: bool | None = None, kv_quantize: str | None = None, key_smoothing=None,
             page_size: int = 16, speculative: Proposer | None = None,
             spec_stats: SpecStats | None = None):
    """Generate up to ``max_new_tokens`` after ``prompt_ids`` in a new sequence of the model's
    KV pool, on the model's runner (``runner_for``): the pool, static steps, CUDA graphs and
    the speculative cost model are the model's runtime's, made by the first call and reused by
    every later one. kv_quantize, key_smoothing, page_size: the pool's (changing them makes the
    pool anew, which needs no other sequence to hold pages)."""
    seed = _check_args(model, max_new_tokens, sampling, seed, pipeline, speculative)
    prompt_ids = _input_ids(model, prompt_ids, "prompt_ids")
    stop_ids = _stop_ids(model, stop_ids)
    total = len(prompt_ids) + max_new_tokens
    if total > model.max_len:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) "
                         f"exceeds the model's max_len {model.max_len}")
    runtime = runtime_of(model)
    with runtime.lock:
        runner = runner_for(model, graphs, page_size=page_size, kv_quantize=kv_quantize,
                            key_smoothing=key_smoothing)
        runtime.reserve_room(runner.cache.pages_for(total))
        cache = runner.cache
        seq = cache.new_sequence()
        try:
            return generate_into(runner, seq, prompt_ids, max_new_tokens, sampling, stop_ids,
                                 seed, on_token, pipeline, speculative, spec_stats)
        finally:
            cache.release(seq)
