"""A step the engine launched and has not completed: what it needs to read the step's tokens
back and hand them to their requests."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .batch_runner import SampledIds


@dataclass(eq=False)
class LaunchedStep:
    """A launched step: its requests, their sequences' lengths before it, the rows sampled in
    it, their ids (on the device, copied to the host), the sampled rows' logits, whether it was
    a static decode step, and the step launched after it from its ids (the successor), if any.
    A pipelined step of requests with grammars is launched unsampled: ``logits`` holds its
    forward's logits until the tokens before it are committed (``LLMEngine._sample_deferred``)."""

    reqs: list
    starts: list[int]
    sampled: list[int]
    ids: SampledIds | None
    rows: torch.Tensor | None
    decode: bool = False
    successor: "LaunchedStep | None" = None
    logits: torch.Tensor | None = None

    def wait(self):
        """Block until the step's work on the device is done."""
        if self.ids is not None:
            self.ids.tolist()
        elif self.logits is not None and self.logits.is_cuda:
            torch.cuda.current_stream(self.logits.device).synchronize()
