"""Checks made before a GGUF import converts anything (a conversion takes seconds to minutes):
the target folder can be created and written, and its disk has room for the model."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .gguf_reader import GGUFImportError

# Beside the weights: tokenizer.json (a few MB for a 150k vocabulary) and the small JSON files.
MARGIN_BYTES = 16 * 2**20


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} kB"


def writable_folder(folder: Path) -> None:
    """Create ``folder`` if needed and check that a file can be written in it."""
    if folder.exists() and not folder.is_dir():
        raise GGUFImportError(f"{folder} is a file, not a folder: move it away, or set "
                              "TILEINFER_HOME to another folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test-")
    except OSError as e:
        raise GGUFImportError(f"cannot write into {folder} ({e.strerror or e}): make it writable, "
                              "or set TILEINFER_HOME to a writable folder") from None
    os.close(fd)
    os.unlink(probe)


def check_room(folder: Path, weight_bytes: int, what: str) -> None:
    """A GGUFImportError unless ``folder`` is writable and its disk holds ``weight_bytes`` plus
    the tokenizer and config files."""
    writable_folder(folder)
    needed = weight_bytes + MARGIN_BYTES
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise GGUFImportError(
            f"importing {what} needs about {_mb(needed)} in {folder}, but only {_mb(free)} is "
            "free: free some space (tileinfer rm NAME) or set TILEINFER_HOME to another disk")


def output_bytes(reader, itemsize: int) -> int:
    """The bytes of the converted weights: every tensor but rope_freqs (folded into the config)
    at ``itemsize`` bytes a value."""
    total = 0
    for t in reader.tensors:
        if t.name != "rope_freqs.weight":
            total += int(t.n_elements) * itemsize
    return total
