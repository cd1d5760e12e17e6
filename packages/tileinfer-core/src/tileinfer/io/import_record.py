"""What marks a finished GGUF import (its ``import.json``), and the error of a failed one: light
to import, so that finding an imported model needs neither the GGUF reader nor numpy."""

from __future__ import annotations

import json
from pathlib import Path

# Raised when an import's folder would differ, so that folders of older imports are redone.
IMPORTER_VERSION = 2


class GGUFImportError(ValueError):
    """The file is not a readable GGUF, or holds something the importer does not support."""


def is_current_import(folder: Path, source: Path) -> bool:
    """Whether ``folder`` holds a complete import of ``source`` by this importer version."""
    try:
        info = json.loads((folder / "import.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        info.get("importer_version") == IMPORTER_VERSION
        and info.get("source_size") == source.stat().st_size
        and (folder / "config.json").is_file()
    )
