"""Where TileInfer keeps its own files (imported models). The hub cache is huggingface_hub's own."""

from __future__ import annotations

import os
from pathlib import Path


def tileinfer_home() -> Path:
    """$TILEINFER_HOME, else $XDG_CACHE_HOME/tileinfer, else ~/.cache/tileinfer."""
    if home := os.environ.get("TILEINFER_HOME"):
        return Path(home).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "tileinfer"


def models_home() -> Path:
    """The folder of imported models (one HF-style folder each)."""
    return tileinfer_home() / "models"
