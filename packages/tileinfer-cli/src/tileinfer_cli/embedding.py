"""An embedding from a model's last-token hidden state: what ``tileinfer embed`` prints and
``tileinfer serve``'s /v1/embeddings answers (no heavy imports: the server's process has none
of the model's)."""

from __future__ import annotations

import math


def embedding(hidden: list[float], dimensions: int | None = None) -> list[float]:
    """The first ``dimensions`` values (all when None: Matryoshka embeddings keep a prefix),
    divided by their L2 norm (as sentence-transformers' Normalize)."""
    kept = hidden[:dimensions] if dimensions is not None else hidden
    norm = math.sqrt(math.fsum(v * v for v in kept))
    return [v / norm for v in kept] if norm > 0 else list(kept)
