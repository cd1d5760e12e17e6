"""The NaN and infinity check of the weights as they load.

``check_finite`` checks one tensor at once: one ``aminmax`` pass (it propagates NaN and shows an
infinity in its min or max; no tensor-sized temporary, which ``isfinite(t).all()`` makes). On a
GPU, reading each tensor's answer back is a wait for the device per tensor (a few hundred in a
small model, each a point where the loading thread lets go of the interpreter's lock and may
wait for it again behind another thread); ``FiniteCheck`` instead launches each tensor's
``aminmax`` as it loads and reads them all back at once in ``flush``, which ``load_weights``
calls once at the end, or after each layer when quantizing (the pending checks hold the layer's
unquantized tensors, which quantizing would otherwise free).
"""

from __future__ import annotations

import torch

from .errors import WeightsError


def check_finite(t: torch.Tensor, name: str) -> torch.Tensor:
    """t, or a WeightsError naming tensor ``name`` if it holds NaN or infinite values."""
    if t.is_floating_point() and t.numel():
        lo, hi = torch.aminmax(t)
        if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
            bad = int((~torch.isfinite(t)).sum())
            raise WeightsError(
                f"tensor {name!r} holds {bad} NaN or infinite value{'s' if bad > 1 else ''} "
                f"(of {t.numel()}) in {str(t.dtype).removeprefix('torch.')}: the checkpoint is "
                "corrupt, or its values overflow this dtype")
    return t


class FiniteCheck:
    """``check_finite`` for many tensors with one read-back per ``flush``."""

    def __init__(self):
        self._pending: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # name, tensor, (lo, hi)

    def add(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """t, its check launched (read by the next ``flush``)."""
        if t.is_floating_point() and t.numel():
            self._pending.append((name, t, torch.stack(torch.aminmax(t)).float()))
        return t

    def flush(self):
        """A WeightsError for the first tensor added since the last flush that holds NaN or
        infinite values (as ``check_finite`` words it)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        ends = torch.stack([ends for _, _, ends in pending])  # (tensors, 2): min and max
        finite = torch.isfinite(ends).all(dim=1)
        if bool(finite.all()):
            return
        first = int((~finite).nonzero()[0])
        name, t, _ = pending[first]
        check_finite(t, name)
