"""Models in TileInfer's own models home: imported GGUF files and the embedded default model.

Each is a folder ``<models home>/NAME`` (``tileinfer import FILE.gguf`` names it after the file;
the default model is ``SmolLM2-135M-Instruct``). They are listed, found and removed by that name,
beside the models pulled into the Hugging Face cache (``hub.py``).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from .import_staging import clean_interrupted_imports
from .paths import models_home


class LocalModelError(ValueError):
    """A name that is not an imported model, or a folder that cannot be removed."""


@dataclass(frozen=True)
class LocalModel:
    """An imported model: its name, folder, size in bytes and the GGUF file it came from."""

    name: str
    path: Path
    size_bytes: int
    source: str | None


def is_plain_name(name) -> bool:
    """Whether ``name`` can name a folder of the models home (no path separators, not hidden)."""
    return (isinstance(name, str) and bool(name) and "/" not in name and "\\" not in name
            and not name.startswith(".") and name not in ("..", "."))


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def local_model_dir(name: str) -> Path | None:
    """The folder of the imported model ``name``, or None."""
    if not is_plain_name(name):
        return None
    folder = models_home() / name
    return folder if (folder / "config.json").is_file() else None


def list_local_models() -> list[LocalModel]:
    """The complete model folders of the models home, by name."""
    try:
        folders = sorted(p for p in models_home().iterdir() if p.is_dir() and is_plain_name(p.name))
    except OSError:
        return []
    models = []
    for folder in folders:
        if not (folder / "config.json").is_file():
            continue
        try:
            source = json.loads((folder / "import.json").read_text(encoding="utf-8")).get("source")
        except (OSError, ValueError, AttributeError):
            source = None
        models.append(LocalModel(folder.name, folder, _size(folder), source))
    return models


def remove_local_model(name: str) -> int:
    """Delete the imported model ``name`` (and the staging folders of killed imports); returns
    the bytes freed."""
    folder = local_model_dir(name)
    if folder is None:
        raise LocalModelError(f"{name!r} is not an imported model in {models_home()}")
    freed = _size(folder)
    shutil.rmtree(folder)
    return freed + sum(size for _, size in clean_interrupted_imports())
