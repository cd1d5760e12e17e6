"""Quantized linear weights: INT8 and FP8 (e4m3), per output channel.

INT8, weight-only: row j of a weight W (out, in) is stored as int8 values
``q[j] = clamp(round(W[j] / scale[j]), -127, 127)`` with ``scale[j] = max|W[j]| / 127`` (1 for an
all-zero row), so ``W[j] ~= scale[j] * q[j]`` with an error of at most scale[j] / 2 per element.
Activations stay in the model dtype (weight-only quantization halves the bytes a decode step
reads, which is what bounds its speed).

FP8: ``q[j] = e4m3(W[j] / scale[j])`` with ``scale[j] = max|W[j]| / 448``; the linear ops quantize
the activations per token as well (``tileinfer.backend.fp8``), so batched steps can run on FP8
tensor cores. The LM head stays in the model dtype (as FP8 checkpoints leave it): it is one
layer, and the logits are what sampling reads.

FP8 weight-only (``"fp8-weight-only"``): the same e4m3 weights and row scales, the activations
left in the model dtype as with INT8 (``tileinfer.backend.fp8``'s weight-only product). It reads
the bytes FP8 reads and skips the activations' rounding, a large part of FP8's error (its
measured share, with nearest and GPTQ-rounded weights: benchmarks/RESULTS.md).

The ``linear`` ops take ``(q, scale)`` in place of a float weight and accumulate in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..backend.fp8 import e4m3_values, quantize_rows

QUANTIZE_CHOICES = (None, "int8", "fp8", "fp8-weight-only")
E4M3_MODES = ("fp8", "fp8-weight-only")  # the modes with e4m3 weights (the LM head kept)
# The BackendInfo field a backend declares to take each mode's linear weights (the others: any).
BACKEND_FIELDS = {"fp8": "fp8", "fp8-weight-only": "fp8_weight_only"}


def backend_takes(info, quantize) -> bool:
    """Whether a backend whose info is ``info`` (a BackendInfo) runs ``quantize``'s weights."""
    field = BACKEND_FIELDS.get(quantize)
    return field is None or bool(getattr(info, field))


@dataclass(frozen=True)
class QuantizedWeight:
    """A linear weight as quantized values q (out, in) and one float32 scale (out,) per row."""

    q: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self):
        return self.q.shape

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return (self.q.float() * self.scale[:, None]).to(dtype)


class Int8Weight(QuantizedWeight):
    """INT8 values (out, in) and their row scales."""


class Fp8Weight(QuantizedWeight):
    """e4m3 values (out, in) and their row scales."""


class Fp8WeightOnly(QuantizedWeight):
    """e4m3 values (out, in) stored as their bit patterns (uint8: what the linear ops take for a
    weight-only e4m3 product) and their row scales."""

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return (e4m3_values(self.q) * self.scale[:, None]).to(dtype)


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Round-to-nearest symmetric INT8 quantization of each row (output channel) of weight."""
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.clamp(torch.round(w / scale[:, None]), -127, 127).to(torch.int8)
    return Int8Weight(q.contiguous(), scale.contiguous())


def quantize_fp8(weight: torch.Tensor) -> Fp8Weight:
    """e4m3 quantization of each row (output channel) of weight, scale max|W[j]| / 448."""
    q, scale = quantize_rows(weight)
    return Fp8Weight(q.contiguous(), scale.contiguous())


def fp8_weight_only(weight: Fp8Weight) -> Fp8WeightOnly:
    """weight's e4m3 values and scales for the weight-only product (no copy)."""
    return Fp8WeightOnly(weight.q.view(torch.uint8), weight.scale)


def check_quantize(quantize) -> None:
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError("quantize must be None, 'int8', 'fp8' or 'fp8-weight-only', got "
                         f"{quantize!r}")


def quantize_linear(weight: torch.Tensor, quantize: str | None, head: bool = False):
    """weight as the linear layers store it for ``quantize``; head: the LM head (kept in its
    dtype with FP8)."""
    if quantize == "int8":
        return quantize_int8(weight)
    if quantize == "fp8" and not head:
        return quantize_fp8(weight)
    if quantize == "fp8-weight-only" and not head:
        return fp8_weight_only(quantize_fp8(weight))
    return weight


def linear_operands(weight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, weight_scale) as the ``linear`` ops take them, for a float or a quantized weight."""
    if isinstance(weight, QuantizedWeight):
        return weight.q, weight.scale
    return weight, None
