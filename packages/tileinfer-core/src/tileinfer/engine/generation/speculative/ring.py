"""Pinned host buffers and device scratch of the pipelined speculative loop's launches, kept per
runner across generations."""

from __future__ import annotations

import weakref

import torch


class Ring:
    """RING buffers per launch slot: pinned host tokens and logits' sums and, for sampled verify
    steps, device tokens and drafts; a slot is written again only once its last use on the
    device has finished (a CUDA event). Kept per runner across generations (``ring_for``)."""

    RING = 8

    def __init__(self, width: int, device):
        self.width, self.device = width, device
        self.cuda = torch.device(device).type == "cuda"
        self.pin = dict(pin_memory=True) if self.cuda else {}
        self.host = [torch.empty(width, dtype=torch.int32, **self.pin) for _ in range(self.RING)]
        self.host_sums = [torch.empty(width, dtype=torch.float32, **self.pin)
                          for _ in range(self.RING)]
        self._sampled = None  # (device tokens, pinned drafts, device drafts) per slot
        self.done = [None] * self.RING
        self.i = -1

    def take(self) -> int:
        self.i = (self.i + 1) % self.RING
        if self.done[self.i] is not None:
            self.done[self.i].synchronize()
        return self.i

    def sampled(self, i):
        """Slot i's device tokens, pinned drafts and device drafts (sampled verify steps)."""
        if self._sampled is None:
            def make(**kw):
                return [torch.empty(self.width, dtype=torch.int32, **kw) for _ in range(self.RING)]
            self._sampled = (make(device=self.device), make(**self.pin), make(device=self.device))
        return tuple(buffers[i] for buffers in self._sampled)

    def record(self, i):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.done[i] = event
            return event
        return None


_RINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def ring_for(runner, width: int) -> Ring:
    """The runner's ring of at least width tokens per slot (made once per runner)."""
    ring = _RINGS.get(runner)
    if ring is None or ring.width < width:
        ring = _RINGS[runner] = Ring(width, runner.model.device)
    return ring
