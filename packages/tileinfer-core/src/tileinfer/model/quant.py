"""INT8 weight-only quantization of linear layers.

Symmetric, per output channel, round to nearest: row j of a weight W (out, in) is stored as int8
values ``q[j] = clamp(round(W[j] / scale[j]), -127, 127)`` with ``scale[j] = max|W[j]| / 127``
(1 for an all-zero row), so ``W[j] ~= scale[j] * q[j]`` with an error of at most scale[j] / 2 per
element. The ``linear`` ops take ``(q, scale)`` in place of a float weight and accumulate in
float32. Activations stay in the model dtype (weight-only quantization halves the bytes a decode
step reads, which is what bounds its speed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Int8Weight:
    """A linear weight as int8 values q (out, in) and one float32 scale (out,) per output row."""

    q: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self):
        return self.q.shape

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return (self.q.float() * self.scale[:, None]).to(dtype)


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Round-to-nearest symmetric INT8 quantization of each row (output channel) of weight."""
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8)
    return Int8Weight(q.contiguous(), scale.contiguous())


def linear_operands(weight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, weight_scale) as the ``linear`` ops take them, for a float or an INT8 weight."""
    if isinstance(weight, Int8Weight):
        return weight.q, weight.scale
    return weight, None
