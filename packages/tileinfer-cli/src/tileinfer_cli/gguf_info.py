"""``tileinfer show FILE.gguf`` for a file not imported yet: what ``show`` says of its import,
read from the file's metadata (the gguf package maps the file and parses its header; no tensor
is converted and nothing is written to the models home, where an import would put a copy of
the weights as large as the file or larger)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

NOT_IMPORTED = "a GGUF file, not imported: run, chat and import convert it"


def gguf_model_info(name: str, path: Path) -> dict:
    """model_info's keys for the GGUF file ``path``: those of the files an import would write
    beside the weights (made here in a temporary folder), and the weights as the file holds
    them (parameters by tensor type)."""
    import gguf
    from tileinfer.io.gguf_import import folder_files
    from tileinfer.io.gguf_reader import open_gguf

    from .model_info import model_info

    reader = open_gguf(path)
    files, _ = folder_files(reader, path)
    with tempfile.TemporaryDirectory(prefix="tileinfer-show-") as folder:
        for file, value in files.items():
            (Path(folder) / file).write_text(json.dumps(value), encoding="utf-8")
        info = model_info(name, Path(folder), NOT_IMPORTED)
    by_type: dict[str, int] = {}
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":  # RoPE factors, which the import folds into config.json
            continue
        kind = gguf.GGMLQuantizationType(t.tensor_type).name
        by_type[kind] = by_type.get(kind, 0) + int(t.n_elements)
    by_type = dict(sorted(by_type.items(), key=lambda kv: -kv[1]))
    return {**info, "path": str(path.resolve()), "parameters": sum(by_type.values()),
            "weights_dtypes": by_type, "size_bytes": path.stat().st_size}
