"""The hidden staging folders that GGUF imports write before renaming them into place, and the
cleanup of those left behind by an import that was killed."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from .paths import models_home

_STAGING = re.compile(r"\.(?P<name>.+)\.importing-(?P<pid>\d+)")


def staging_dir(out_dir: Path) -> Path:
    """The hidden folder an import into ``out_dir`` (or ``tileinfer quantize``'s checkpoint)
    writes before renaming it into place."""
    return out_dir.parent / f".{out_dir.name}.importing-{os.getpid()}"


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # a process of another user (or an odd number): leave its folder alone
    return True


def interrupted_imports(folder: Path | None = None) -> list[Path]:
    """Staging folders in ``folder`` (default: the models home) whose importing process is gone."""
    folder = models_home() if folder is None else Path(folder)
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    found = []
    for entry in entries:
        m = _STAGING.fullmatch(entry.name)
        if m and entry.is_dir() and not _process_alive(int(m["pid"])):
            found.append(entry)
    return sorted(found)


def clean_interrupted_imports(folder: Path | None = None) -> list[tuple[Path, int]]:
    """Remove the staging folders left by killed imports; returns (folder, bytes freed) each."""
    removed = []
    for entry in interrupted_imports(folder):
        size = sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append((entry, size))
    return removed
