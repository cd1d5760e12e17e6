"""What ``tileinfer show`` tells about a model folder, read from its files (no weights loaded):
config.json, the safetensors headers, the chat template, generation_config.json, the license
(README front matter, a LICENSE file, or the GGUF file an import came from) and where it lives."""

from __future__ import annotations

import json
import struct
from pathlib import Path

README_FILES = ("README.md", "readme.md")
LICENSE_FILES = ("LICENSE", "LICENSE.md", "LICENSE.txt", "license.txt")


def _json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def safetensors_summary(folder: Path) -> tuple[int, dict]:
    """(parameter count, {dtype: parameters}) from the headers of the folder's safetensors
    files: 8 bytes of header length, then a JSON header of every tensor's dtype and shape."""
    total, dtypes = 0, {}
    for file in sorted(folder.glob("*.safetensors")):
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            n = 1
            for d in entry["shape"]:
                n *= d
            total += n
            dtypes[entry["dtype"]] = dtypes.get(entry["dtype"], 0) + n
    return total, dtypes


def front_matter_license(folder: Path) -> str | None:
    """``license:`` of a README's YAML front matter (the Hugging Face model card)."""
    for name in README_FILES:
        try:
            text = (folder / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not text.startswith("---"):
            return None
        for line in text.split("\n---", 1)[0].splitlines()[1:]:
            key, _, value = line.partition(":")
            if key.strip() == "license" and value.strip():
                return value.strip().strip("'\"")
    return None


def license_of(folder: Path, imported: dict) -> str | None:
    found = front_matter_license(folder) or imported.get("license")
    if found:
        return found
    for name in LICENSE_FILES:
        try:
            lines = (folder / name).read_text(encoding="utf-8").strip().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        if lines:
            return f"{lines[0].strip()} ({name})"
    return None


def gguf_source(imported: dict) -> dict:
    """import.json's summary of the GGUF file, read from that file when an older import did
    not keep one and the file is still there."""
    if "tensor_types" in imported or not imported.get("source"):
        return imported
    path = Path(imported["source"])
    if not path.is_file():
        return imported
    from tileinfer.io.gguf_reader import open_gguf, source_summary

    try:
        return {**imported, **source_summary(open_gguf(path), path)}
    except ValueError:
        return imported


def chat_template_text(folder: Path) -> str | None:
    from tileinfer import ChatTemplateError
    from tileinfer.io.chat_template import load_chat_template

    try:
        return load_chat_template(folder)
    except (ChatTemplateError, OSError, ValueError):
        return None


def model_info(name: str, folder: Path, kind: str) -> dict:
    from tileinfer import generation_defaults

    config = _json(folder / "config.json")
    imported = gguf_source(_json(folder / "import.json"))
    params, dtypes = safetensors_summary(folder)
    sampling, stop_ids = generation_defaults(folder, config)
    gen = _json(folder / "generation_config.json")
    quant = config.get("quantization_config")
    return {
        "name": name,
        "kind": kind,
        "path": str(folder),
        "architecture": (config.get("architectures") or [config.get("model_type")])[0],
        "model_type": config.get("model_type"),
        "parameters": params,
        "layers": config.get("num_hidden_layers"),
        "hidden_size": config.get("hidden_size"),
        "vocab_size": config.get("vocab_size"),
        "context_length": config.get("max_position_embeddings"),
        "dtype": config.get("torch_dtype") or config.get("dtype"),
        "weights_dtypes": dtypes,
        "quantization": quant.get("quant_method", "yes") if isinstance(quant, dict) else None,
        "gguf_source": ({"path": imported.get("source"), "name": imported.get("name"),
                         "tensor_types": imported.get("tensor_types")}
                        if imported.get("source") else None),
        "chat_template": chat_template_text(folder),
        "generation_defaults": {"temperature": sampling.temperature, "top_p": sampling.top_p,
                                "top_k": sampling.top_k, "min_p": sampling.min_p,
                                "repetition_penalty": sampling.repetition_penalty,
                                "stop_ids": stop_ids,
                                **({"max_new_tokens": gen["max_new_tokens"]}
                                   if "max_new_tokens" in gen else {})},
        "license": license_of(folder, imported),
        "size_bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
    }
