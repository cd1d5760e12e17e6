"""Static step tensors as views of one int32 device buffer, filled by one host-to-device copy."""

from __future__ import annotations

import torch


class PackedUpload:
    """Static step tensors as views of one int32 device buffer, filled by one copy per step.

    Layout: the int64 tensors first (8-byte aligned), ``ids`` last, so that a step whose ids come
    from the device (pipelined decoding) copies everything before them. The host stages each
    step in a pinned buffer (a true asynchronous copy); RING buffers rotate, and one is written
    again only once its copy has finished (a CUDA event), so the host can run steps ahead."""

    RING = 4

    def __init__(self, shapes: dict, device):
        self.layout = {}  # name -> (first int32 word, words, shape, dtype)
        words = 0
        for name, (shape, dtype) in shapes.items():
            count = 1
            for dim in shape:
                count *= dim
            width = torch.empty((), dtype=dtype).element_size() // 4
            self.layout[name] = (words, count * width, shape, dtype)
            words += count * width
        if list(self.layout)[-1] != "ids":
            raise ValueError("PackedUpload: ids must come last")
        self.ids_start = self.layout["ids"][0]
        self.device = torch.zeros(words, dtype=torch.int32, device=device)
        self.views = {name: self._view(self.device, name) for name in self.layout}
        self._host = [torch.zeros(words, dtype=torch.int32, pin_memory=True)
                      for _ in range(self.RING)]
        self._copied = [torch.cuda.Event() for _ in range(self.RING)]
        self._in_use = [False] * self.RING
        self._next = 0

    def _view(self, buffer: torch.Tensor, name: str) -> torch.Tensor:
        start, words, shape, dtype = self.layout[name]
        return buffer[start:start + words].view(dtype).view(shape)

    def send(self, tensors: dict, keep_ids: bool = False):
        """Copy the host tensors (name -> tensor shaped as the views) to the device views."""
        i = self._next
        self._next = (i + 1) % self.RING
        if self._in_use[i]:
            self._copied[i].synchronize()  # its previous copy has left the pinned buffer
        host = self._host[i]
        for name, tensor in tensors.items():
            self._view(host, name).copy_(tensor)
        end = self.ids_start if keep_ids else host.numel()
        self.device[:end].copy_(host[:end], non_blocking=True)
        self._copied[i].record()
        self._in_use[i] = True
