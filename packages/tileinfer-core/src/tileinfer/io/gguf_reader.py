"""Opening a GGUF file with the ``gguf`` package (llama.cpp's reader), and typed access to its
metadata."""

from __future__ import annotations

from pathlib import Path

import gguf


class GGUFImportError(ValueError):
    """The file is not a readable GGUF, or holds something the importer does not support."""


class GGUFMetadata:
    """Typed access to a GGUF file's key/value metadata."""

    def __init__(self, reader: gguf.GGUFReader, path: Path):
        self.reader = reader
        self.path = path

    def get(self, key: str, default=None):
        field = self.reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except Exception as e:
            raise GGUFImportError(f"{self.path}: cannot read metadata {key}: {e}") from e

    def require(self, key: str):
        value = self.get(key)
        if value is None:
            raise GGUFImportError(f"{self.path}: the metadata key {key} is missing")
        return value


def open_gguf(path: Path) -> gguf.GGUFReader:
    if not path.is_file():
        raise GGUFImportError(f"no such GGUF file: {path}")
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # truncated or not a GGUF: the reader raises ValueError, IndexError, ...
        raise GGUFImportError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from e
