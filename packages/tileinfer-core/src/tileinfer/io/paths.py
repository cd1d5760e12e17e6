"""Where TileInfer keeps its own files (imported models, chat history, logs). The hub cache is
huggingface_hub's own."""

from __future__ import annotations

import os
from pathlib import Path


class HomeError(ValueError):
    """TileInfer's home is not a folder (``TILEINFER_HOME`` names a file)."""


def tileinfer_home() -> Path:
    """$TILEINFER_HOME, else $XDG_CACHE_HOME/tileinfer, else ~/.cache/tileinfer. A HomeError if
    that path exists and is not a folder."""
    if home := os.environ.get("TILEINFER_HOME"):
        path, named = Path(home).expanduser(), f"TILEINFER_HOME={home}"
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(cache).expanduser() / "tileinfer"
        named = f"TileInfer's home {path}"
    if path.exists() and not path.is_dir():
        raise HomeError(f"{named} is a file, not a folder: point TILEINFER_HOME at a folder")
    return path


def models_home() -> Path:
    """The folder of imported models (one HF-style folder each)."""
    return tileinfer_home() / "models"
