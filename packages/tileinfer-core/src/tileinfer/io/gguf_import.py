"""Import a llama.cpp GGUF file as an HF-style model folder that the rest of TileInfer loads.

The ``gguf`` package (llama.cpp's own reader) reads the file and dequantizes its tensors. Five
of llama.cpp's architectures are read: ``llama``, ``qwen2`` (Qwen2, Qwen2.5: the same tensors
plus the q/k/v biases), ``qwen3`` (plus the per-head q/k norms), ``phi3`` (Phi-3: q/k/v and
gate/up stored fused, an attention window) and ``gemma3`` (Gemma 3's text models, read as
``gemma3_text``: llama.cpp stores their norms as 1 + w, and sets their layer pattern, local RoPE
base and query scale itself). The folder gets config.json (the model_type of the
same name, from the GGUF metadata: ``gguf_config``), model.safetensors (bf16 by default:
``gguf_tensors``), tokenizer.json (built with ``tokenizers`` from the GGUF vocabulary, merges and
token types: ``gguf_tokenizer``), tokenizer_config.json (chat template, BOS/EOS),
generation_config.json and import.json (where it came from, its license, name and tensor types,
and the importer version, so a stale import can be redone).

An import writes into a hidden staging folder ``.NAME.importing-PID`` beside the target and
renames it into place when complete. One that was killed (SIGKILL, a power cut) leaves that
folder behind; the next import into the same models home, and ``tileinfer rm``, remove every
staging folder whose process is gone (``clean_interrupted_imports``). A progress bar on standard
error (tqdm; shown when it is a terminal, or with ``progress=True``) follows the import: reading
the metadata, converting the tensors, writing the folder.

llama.cpp stores a llama model's q and k projections with the rows of each head reordered for its
RoPE (``permute`` in llama.cpp's convert_hf_to_gguf.py: ``(heads, 2, head_dim/2, in)`` swapped to
``(heads, head_dim/2, 2, in)``); the import swaps them back, with n_head = kv heads for k. Qwen,
Phi-3 and Gemma 3 models' are stored as in transformers (their RoPE pairs the halves of a
head, as transformers does).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from .gguf_config import ARCHITECTURES, config_from
from .gguf_reader import GGUFImportError, GGUFMetadata, open_gguf, source_summary
from .gguf_tensors import GGUFImportWarning, check_shapes, dequantized, read_weights  # noqa: F401
from .gguf_tokenizer import build_tokenizer, end_of_generation_ids, generation_config_from
from .import_record import IMPORTER_VERSION, is_current_import, source_record  # noqa: F401
from .import_room import check_room, output_bytes
from .import_staging import clean_interrupted_imports, staging_dir
from .paths import models_home


@contextlib.contextmanager
def _progress(path: Path, enabled: bool | None):
    """A tqdm bar over the file's bytes (metadata, then tensors), redrawn every half second so
    that its clock runs while the gguf reader parses the metadata, which reports nothing."""
    bar = tqdm(total=path.stat().st_size, unit="B", unit_scale=True, unit_divisor=1024,
               desc=f"importing {path.name}: reading metadata", disable=None if enabled is None else not enabled,
               leave=False, dynamic_ncols=True)
    stop = threading.Event()

    def tick():
        while not stop.wait(0.5):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True) if not bar.disable else None
    if ticker is not None:
        ticker.start()
    try:
        yield bar
    finally:
        stop.set()
        if ticker is not None:
            ticker.join()
        bar.close()


# --- the import --------------------------------------------------------------------------------


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _readable_like_the_others(file: Path) -> None:
    """safetensors writes its file 0600; give it the mode the umask gives new files (0644 under
    umask 022), like the JSON files beside it."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(file, 0o666 & ~mask)


def import_gguf(
    path: str | Path,
    out_dir: str | Path | None = None,
    name: str | None = None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    progress: bool | None = None,
) -> Path:
    """Write the model of the GGUF file at ``path`` as an HF-style folder and return the folder.

    The folder is ``out_dir``, else ``<models home>/<name>`` (name defaults to the file's stem; the
    models home is $TILEINFER_HOME/models or ~/.cache/tileinfer/models). An existing folder there is
    replaced. The folder appears whole or not at all: it is written beside and renamed into place;
    staging folders of killed imports there are removed first. progress: a bar on standard error
    (None: only when it is a terminal).
    """
    path = Path(path).expanduser()
    if dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"dtype must be bfloat16, float16 or float32, got {dtype}")
    if name is not None and (not name or "/" in name or "\\" in name or name.startswith(".")):
        raise ValueError(f"an imported model's name must be a plain folder name, got {name!r}")
    if not path.is_file():
        raise GGUFImportError(f"no such GGUF file: {path}")
    with _progress(path, progress) as bar:
        return _import(path, out_dir, name, dtype, bar)


def folder_files(reader, path: Path, dtype: torch.dtype = torch.bfloat16) -> tuple[dict, object]:
    """What an import of the file writes beside its weights, read from the metadata alone (no
    tensor converted): ``({file name: JSON object}, tokenizer)`` for config.json,
    tokenizer_config.json, generation_config.json and import.json, and the tokenizer of
    tokenizer.json. ``tileinfer show FILE.gguf`` reads these without importing."""
    meta = GGUFMetadata(reader, path)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFImportError(f"{path}: architecture {arch!r} is not supported (supported: "
                              f"{', '.join(ARCHITECTURES)})")

    tokenizer, token_strings = build_tokenizer(meta)
    rope = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    rope_freqs = dequantized(rope, path).astype(np.float64) if rope is not None else None
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    vocab_size = int(meta.get(f"{arch}.vocab_size", tokenizer.get_vocab_size(with_added_tokens=True)))
    config = config_from(meta, arch, vocab_size, tied, rope_freqs, dtype)
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        **token_strings,
    }
    template = meta.get("tokenizer.chat_template")
    if template is not None:
        tokenizer_config["chat_template"] = template
    stop_ids = end_of_generation_ids(meta, tokenizer)
    return {
        "tokenizer_config.json": tokenizer_config,
        "generation_config.json": generation_config_from(meta, config, stop_ids),
        "config.json": config,
        "import.json": {**source_record(path), "importer_version": IMPORTER_VERSION,
                        **source_summary(reader, path)},
    }, tokenizer


def _import(path: Path, out_dir, name, dtype, bar) -> Path:
    reader = open_gguf(path)
    bar.update(path.stat().st_size - sum(int(t.n_bytes) for t in reader.tensors))
    bar.set_description(f"importing {path.name}: converting tensors")
    files, tokenizer = folder_files(reader, path, dtype)
    config = files["config.json"]
    out_dir = Path(out_dir).expanduser() if out_dir is not None else models_home() / (name or path.stem)
    clean_interrupted_imports(out_dir.parent)
    check_room(out_dir.parent, output_bytes(reader, dtype.itemsize), path.name)
    tensors = read_weights(reader, path, config, dtype, bar)
    check_shapes(tensors, config, path)
    bar.set_description(f"importing {path.name}: writing the model folder")

    staging = staging_dir(out_dir)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        _readable_like_the_others(staging / "model.safetensors")
        tokenizer.save(str(staging / "tokenizer.json"))
        for file, value in files.items():
            _write_json(staging / file, value)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    except OSError as e:  # a disk that filled up meanwhile, a folder made read-only
        shutil.rmtree(staging, ignore_errors=True)
        raise GGUFImportError(f"writing {out_dir} failed ({e.strerror or e}); the import "
                              "did not complete") from e
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


