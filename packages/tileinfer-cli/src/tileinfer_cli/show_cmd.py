"""``tileinfer show MODEL [--json]``: a model's architecture, size, context, precision, chat
template, generation defaults, license and where it lives, read from its files. A .gguf file
that is not imported yet is read where it is, without importing it (``gguf_info``)."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import UserError
from .gguf_info import NOT_IMPORTED

EPILOG = """\
examples:
  tileinfer show SmolLM2-135M-Instruct
  tileinfer show Qwen/Qwen3-0.6B --json | jq .context_length
  tileinfer show ./my-model-folder
  tileinfer show model.gguf                   read from the file (not imported)
"""
TEMPLATE_LINES = 6


def add_parser(sub, formatter):
    p = sub.add_parser("show", help="show a model's architecture, size, template and license",
                       epilog=EPILOG, formatter_class=formatter)
    p.add_argument("model", metavar="MODEL", nargs="?",
                   help="a folder, a pulled repo id, an imported name or a .gguf file "
                        "(default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def kind_of(name) -> str:
    from tileinfer.io.default_model import DEFAULT_MODEL_NAME
    from tileinfer.io.local_models import local_model_dir

    if name is None or name == DEFAULT_MODEL_NAME:
        return "default, imported"
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return "imported from a GGUF file"
    if path.is_dir():
        return "folder"
    return "imported" if local_model_dir(name) is not None else "pulled"


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit} ({n:,})"
    return str(n)


def run(args, out):
    from tileinfer import resolve_model_dir

    gguf = unimported_gguf(args.model)
    if gguf is not None:
        from .gguf_info import gguf_model_info

        info = gguf_model_info(args.model, gguf)
    else:
        folder = resolve_model_dir(args.model)
        if not (folder / "config.json").is_file():
            raise UserError(f"no config.json in {folder}: not a model folder")
        from .model_info import model_info

        info = model_info(args.model or folder.name, folder, kind_of(args.model))
    if args.json:
        print(json.dumps(info, ensure_ascii=False, indent=2), file=out)
        return 0
    for label, value in rows(info):
        print(f"  {label:<16} {value}" if label else value, file=out)
    return 0


def unimported_gguf(name) -> Path | None:
    """The .gguf file ``name`` when no current import of it is in the models home."""
    if name is None:
        return None
    path = Path(name).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        return None
    from tileinfer.io.import_record import is_current_import
    from tileinfer.io.model_dir import imported_folder

    return None if is_current_import(imported_folder(path), path) else path


def rows(info: dict):
    yield "", f"{info['name']}  ({info['kind']})"
    yield "path", info["path"]
    yield "architecture", (f"{info['architecture']}: {info['layers']} layers, hidden "
                           f"{info['hidden_size']}, vocabulary {info['vocab_size']}")
    yield "parameters", _count(info["parameters"])
    yield "context length", info["context_length"]
    weights = ", ".join(f"{d} {_count(n).split()[0]}" for d, n in info["weights_dtypes"].items())
    imported = info["kind"] != NOT_IMPORTED
    yield "dtype", (f"{info['dtype']} (weights: {weights or 'none found'})" if imported else
                    f"{info['dtype']} once imported (weights in the file: {weights})")
    source = info["gguf_source"]
    quant = info["quantization"] or "none"
    if source and source.get("tensor_types"):
        types = ", ".join(f"{t} x{n}" for t, n in source["tensor_types"].items())
        quant += (f"; imported (dequantized) from a GGUF of {types}" if imported else
                  f"; a GGUF of {types}, dequantized on import")
    yield "quantization", quant
    yield "license", info["license"] or "not stated in the model's files"
    g = info["generation_defaults"]
    penalties = "".join(f", {name} {g[name]}" for name, off in (("min_p", 0.0),
                                                                ("repetition_penalty", 1.0))
                        if g[name] != off)
    # What run, chat and generate take; tileinfer serve takes OpenAI's defaults (temperature 1)
    # where generation_config.json sets none, as vLLM does, and says so when it starts.
    yield "generation", (f"run and chat: temperature {g['temperature']}, top_p {g['top_p']}, "
                         f"top_k {g['top_k']}{penalties}; ends at token ids {g['stop_ids']}"
                         + (f"; max_new_tokens {g['max_new_tokens']}" if "max_new_tokens" in g
                            else ""))
    template = info["chat_template"]
    if template is None:
        yield "chat template", "none (tileinfer run --raw, or --chat-template FILE)"
        return
    lines = template.strip("\n").splitlines()
    yield "chat template", f"{len(lines)} lines" + (f", the first {TEMPLATE_LINES}:"
                                                    if len(lines) > TEMPLATE_LINES else ":")
    for line in lines[:TEMPLATE_LINES]:
        yield "", f"    | {line}"
