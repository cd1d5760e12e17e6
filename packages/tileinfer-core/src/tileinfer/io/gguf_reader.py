"""Opening a GGUF file with the ``gguf`` package (llama.cpp's reader), and typed access to its
metadata."""

from __future__ import annotations

from pathlib import Path

import gguf

from .import_record import GGUFImportError


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


def source_summary(reader: gguf.GGUFReader, path: Path) -> dict:
    """What an imported folder keeps of its GGUF file beside the weights: the license and name
    the file declares (None when it does not) and how many tensors of each type it holds (its
    quantization: Q4_1, Q8_0, ...)."""
    meta = GGUFMetadata(reader, path)
    types: dict[str, int] = {}
    for t in reader.tensors:
        name = gguf.GGMLQuantizationType(t.tensor_type).name
        types[name] = types.get(name, 0) + 1
    return {"license": meta.get("general.license"), "name": meta.get("general.name"),
            "tensor_types": dict(sorted(types.items(), key=lambda kv: -kv[1]))}
