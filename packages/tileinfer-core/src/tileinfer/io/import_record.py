"""What marks a finished GGUF import (its ``import.json``), and the error of a failed one: light
to import, so that finding an imported model needs neither the GGUF reader nor numpy."""

from __future__ import annotations

import json
from pathlib import Path

# Raised when an import's folder would differ, so that folders of older imports are redone.
IMPORTER_VERSION = 2


class GGUFImportError(ValueError):
    """The file is not a readable GGUF, or holds something the importer does not support."""


def source_record(source: Path) -> dict:
    """What import.json keeps of the file it was made from: its absolute path, size and
    modification time (a file replaced by another of the same size is a new source)."""
    stat = source.stat()
    return {"source": str(source.resolve()), "source_size": stat.st_size,
            "source_mtime_ns": stat.st_mtime_ns}


def _import_json(folder: Path) -> dict | None:
    """``folder``'s import.json, or None where it has none (or an unreadable one)."""
    try:
        info = json.loads((folder / "import.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def imported_source(folder: Path) -> str | None:
    """The absolute path of the file ``folder`` was imported from; None if it holds no import."""
    info = _import_json(folder)
    return None if info is None else info.get("source")


def is_current_import(folder: Path, source: Path) -> bool:
    """Whether ``folder`` holds a complete import of ``source`` as it is now (the same path,
    size and modification time) by this importer version."""
    info = _import_json(folder)
    return (
        info is not None
        and info.get("importer_version") == IMPORTER_VERSION
        and all(info.get(key) == value for key, value in source_record(source).items())
        and (folder / "config.json").is_file()
    )
