"""warm_up: one short generation that makes what a model's first answer would otherwise make.

A new process's first answer pays once for work that no later answer repeats: loading each
kernel (and, on Triton, looking it up in its on-disk cache), making the KV pool, the static
buffers of the 1-token decode step and its CUDA graph. ``warm_up`` runs a generation of a few
tokens after a made-up prompt with the same sampling and KV settings, and throws the answer away;
the model's runtime keeps the rest, so the first real answer starts at its own speed.
llama.cpp's command-line tools do the same at load (an empty run; ``--no-warmup``).
"""

from __future__ import annotations

import dataclasses

from ...backend.sampling import SamplingParams
from .generate import generate
from .runner import MIN_PREFILL_BUCKET

# Tokens of the made-up prompt: the smallest prefill bucket; then two decode steps (the second
# replays the decode step's graph that the first captured).
PROMPT_TOKENS = MIN_PREFILL_BUCKET
NEW_TOKENS = 3


def warm_up(model, sampling: SamplingParams = SamplingParams(), kv_quantize: str | None = None,
            key_smoothing=None, page_size: int = 16) -> None:
    """Generate ``NEW_TOKENS`` after a made-up prompt and drop them. sampling, kv_quantize,
    key_smoothing and page_size: those of the answers to come (another sampling mode or KV pool
    would make other steps). A structured-output grammar is left out: it belongs to one answer."""
    if sampling.structure is not None:
        sampling = dataclasses.replace(sampling, structure=None)
    if model.max_len < PROMPT_TOKENS + NEW_TOKENS:
        return
    vocab = model.config.vocab_size
    prompt = [(7 * i + 1) % vocab for i in range(PROMPT_TOKENS)]
    generate(model, prompt, NEW_TOKENS, sampling, seed=0, kv_quantize=kv_quantize,
             key_smoothing=key_smoothing, page_size=page_size)
