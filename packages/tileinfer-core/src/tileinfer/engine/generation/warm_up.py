"""warm_up: one short generation that makes what a model's first answer would otherwise make.

A new process's first answer pays once for work that no later answer repeats: loading each
kernel (and, on Triton, looking it up in its on-disk cache), making the KV pool, the static
buffers of the 1-token decode step and its CUDA graph. ``warm_up`` runs a generation of a few
tokens after a made-up prompt with the same sampling and KV settings, and throws the answer away;
the model's runtime keeps the rest, so the first real answer starts at its own speed.
llama.cpp's command-line tools do the same at load (an empty run; ``--no-warmup``).

With a host proposer (``speculative=NgramProposer()``), the answers to come also run verify
steps of 2..k + 1 rows: warm_up captures each of them too and times each size against the
1-token step, seeding the speculative loop's cost model, which otherwise learns a size's cost
only from its first uses. Without that, one answer pays a capture for every size it happens to
use, more than its drafts save on a short answer.

The sizes are timed as the loop pays for them. 1-token steps run back to back, as plain
stretches of the loop do. A verify step usually follows a step whose tokens the host had to read
first (its drafts come from them), so the device idles while the host reads and launches: each
timed verify step here is launched only after the one before it is read back. Timed back to
back, a verify step would look almost as cheap as a 1-token step, which is not what the loop
pays, and a first answer would draft where later answers do not.
"""

from __future__ import annotations

import dataclasses

import torch

from ...backend.sampling import SamplingParams
from ..runtime.runtime import runtime_of
from .generate import generate
from .runner import MIN_PREFILL_BUCKET, runner_for
from .speculative.proposer import check_proposer
from .speculative.step_costs import record_step_seconds

# Tokens of the made-up prompt: the smallest prefill bucket; then two decode steps (the second
# replays the decode step's graph that the first captured).
PROMPT_TOKENS = MIN_PREFILL_BUCKET
NEW_TOKENS = 3
TIMED_RUNS = 3  # timed replays of each verify step size (the cost model takes their median)


def warm_up(model, sampling: SamplingParams = SamplingParams(), kv_quantize: str | None = None,
            key_smoothing=None, page_size: int = 16, speculative=None) -> None:
    """Generate ``NEW_TOKENS`` after a made-up prompt and drop them. sampling, kv_quantize,
    key_smoothing and page_size: those of the answers to come (another sampling mode or KV pool
    would make other steps). A structured-output grammar is left out: it belongs to one answer.
    speculative: the proposer of the answers to come; a host proposer's (n-gram) verify steps
    are captured and timed as well (see the module docstring)."""
    check_proposer(speculative)
    if sampling.structure is not None:
        sampling = dataclasses.replace(sampling, structure=None)
    if model.max_len < PROMPT_TOKENS + NEW_TOKENS:
        return
    vocab = model.config.vocab_size
    prompt = [(7 * i + 1) % vocab for i in range(PROMPT_TOKENS)]
    generate(model, prompt, NEW_TOKENS, sampling, seed=0, kv_quantize=kv_quantize,
             key_smoothing=key_smoothing, page_size=page_size)
    if speculative is not None and callable(getattr(speculative, "continuation", None)):
        _warm_verify_steps(model, prompt, sampling, speculative.k, kv_quantize, key_smoothing,
                           page_size)


def _warm_verify_steps(model, prompt, sampling, k: int, kv_quantize, key_smoothing,
                       page_size: int):
    """Capture the pipelined speculative loop's steps of 2..k + 1 rows (greedy: every row's
    argmax inside the graph; sampled: the logits of every row) and time steps of 1..k + 1 rows
    run back to back, as the loop times them, into the runtime's ``step_seconds``."""
    runtime = runtime_of(model)
    if not runtime.graphs or model.max_len < len(prompt) + k + 1:
        return
    with runtime.lock:
        runner = runner_for(model, page_size=page_size, kv_quantize=kv_quantize,
                            key_smoothing=key_smoothing)
        runner.add_sizes(range(1, k + 2))
        cache = runner.cache
        runtime.reserve_room(cache.pages_for(len(prompt) + k + 1))
        seq = cache.new_sequence()
        try:
            runner.forward(seq, prompt)
            base = len(seq)
            greedy = sampling.greedy

            def step(n: int):
                cache.truncate(seq, base)
                ids = prompt[:n]
                if n == 1:  # the decode step's captured variant (sampling included)
                    runner.forward(seq, ids, sampling)
                else:
                    runner.forward(seq, ids, sampling if greedy else None, all_logits=True,
                                   sample_rows=greedy)

            for n in range(1, k + 2):
                # The first step of a size captures its graph (the 1-token step's was captured
                # by the generation above). A timed 1-token step is launched while the one
                # before runs; a timed verify step once the one before is read (see above).
                step(n)
                events = [torch.cuda.Event(enable_timing=True) for _ in range(TIMED_RUNS + 1)]
                events[0].record()
                for before, event in zip(events, events[1:]):
                    if n > 1:
                        before.synchronize()  # the host waits for the step before
                    step(n)
                    event.record()
                events[-1].synchronize()
                for before, after in zip(events, events[1:]):
                    record_step_seconds(runner.step_seconds, n,
                                        before.elapsed_time(after) / 1e3)
        finally:
            cache.release(seq)
