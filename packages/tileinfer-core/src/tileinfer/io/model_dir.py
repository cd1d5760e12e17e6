"""The one way a model name becomes a folder, shared by the library and the command line."""

from __future__ import annotations

from pathlib import Path

from .default_model import default_model_dir
from .gguf_import import import_gguf, is_current_import
from .hub import model_dir
from .paths import models_home


def resolve_model_dir(model=None) -> Path:
    """The folder of ``model``: the embedded default model for None; a folder as it is; a
    ``.gguf`` file imported once into the models home (re-imported when the file or the importer
    changed); else the snapshot of a pulled repo id. Never touches the network."""
    if model is None:
        return default_model_dir()
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        folder = models_home() / path.stem
        return folder if is_current_import(folder, path) else import_gguf(path, folder)
    return model_dir(model)
