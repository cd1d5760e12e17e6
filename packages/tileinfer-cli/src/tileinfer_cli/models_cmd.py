"""``tileinfer pull | list | rm | import``: the models here.

Two places hold them: the Hugging Face cache (``pull``: repo ids such as Qwen/Qwen3-0.6B) and
TileInfer's models home (``import``: GGUF files, and the embedded default model), whose models go
by their folder's name. ``pull OWNER/NAME:TAG`` downloads one quantization of a GGUF repo into
the cache and imports it into the models home. ``list`` shows both, ``rm`` removes either and
the leftovers of killed imports.
"""

from __future__ import annotations

import json

from .errors import UserError

PULL_EPILOG = """\
examples:
  tileinfer pull Qwen/Qwen3-0.6B
  HF_TOKEN=hf_... tileinfer pull meta-llama/Llama-3.2-1B-Instruct
  tileinfer pull Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q8_0    one GGUF file, imported (dequantized)
"""
RM_EPILOG = """\
examples:
  tileinfer rm Qwen/Qwen3-0.6B                 a pulled model (every revision)
  tileinfer rm Qwen/Qwen3-0.6B --revision main
  tileinfer rm my-model                        an imported model (tileinfer list shows names)
  tileinfer rm OWNER/NAME-GGUF:Q8_0            the import of a pulled GGUF quantization
"""
IMPORT_EPILOG = """\
examples:
  tileinfer import ~/Downloads/Llama-3.2-1B-Instruct-Q8_0.gguf
  tileinfer import model.gguf --name llama1b && tileinfer run -m llama1b "Hi"
  tileinfer import model.gguf --force         convert again over the earlier import
"""


def add_parser(sub, formatter):
    p = sub.add_parser("pull", help="download a model's inference files from the Hugging Face hub",
                       epilog=PULL_EPILOG, formatter_class=formatter)
    p.add_argument("repo_id", help="OWNER/NAME on the hub, or OWNER/NAME:TAG for the GGUF file "
                                   "of that quantization in a GGUF repo")
    p.add_argument("--revision", default="main", help="branch, tag or commit")
    p.set_defaults(func=pull)

    p = sub.add_parser("list", help="list pulled, imported and default models",
                       formatter_class=formatter)
    p.add_argument("--json", action="store_true",
                   help="print a JSON list: name, kind, revision, size_bytes, path")
    p.set_defaults(func=list_)

    p = sub.add_parser("rm", help="remove a pulled or imported model (and killed imports' "
                       "leftovers)", epilog=RM_EPILOG, formatter_class=formatter)
    p.add_argument("name", metavar="NAME", help="a repo id or an imported model's name")
    p.add_argument("--revision", help="only this revision of a pulled model (default: all)")
    p.set_defaults(func=rm)

    p = sub.add_parser("import", help="import a GGUF file as a model folder in the models home",
                       epilog=IMPORT_EPILOG, formatter_class=formatter)
    p.add_argument("path", help="the .gguf file")
    p.add_argument("--name", help="the model's name (default: the file's name without .gguf)")
    p.add_argument("--force", action="store_true",
                   help="convert again over a model of that name (default: keep it and say so)")
    p.set_defaults(func=import_)


def pull(args, out):
    from tileinfer.io.hub import pull, pull_gguf
    from tileinfer.io.model_dir import gguf_reference

    reference = gguf_reference(args.repo_id)
    if reference is None:
        path = pull(args.repo_id, revision=args.revision)
        print(f"pulled {args.repo_id} ({args.revision}) into {path}", file=out)
        return 0
    from tileinfer.io.model_dir import imported_model_dir

    repo, tag = reference
    path = pull_gguf(repo, tag, revision=args.revision)
    # imported into the models home once, as `import` would (a newer file replaces the import)
    folder = imported_model_dir(path, replaces_another=True)
    print(f"pulled {path.name} of {repo} ({args.revision}) and imported it as {folder.name}: "
          f"tileinfer run -m {folder.name}", file=out)
    return 0


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def list_(args, out):
    from tileinfer import DefaultModelUnavailable
    from tileinfer.io.default_model import DEFAULT_MODEL_NAME, default_gguf_path
    from tileinfer.io.hub import list_models
    from tileinfer.io.local_models import list_local_models

    rows = [{"name": m.repo_id, "kind": "pulled", "revision": m.revision,
             "size_bytes": m.size_bytes, "path": str(m.path)} for m in list_models()]
    local = list_local_models()
    for m in local:
        kind = "default, imported" if m.name == DEFAULT_MODEL_NAME else "imported"
        rows.append({"name": m.name, "kind": kind, "revision": None,
                     "size_bytes": m.size_bytes, "path": str(m.path)})
    if DEFAULT_MODEL_NAME not in {m.name for m in local}:
        try:
            source = default_gguf_path()
            rows.append({"name": DEFAULT_MODEL_NAME, "kind": "default, imported on first use",
                         "revision": None, "size_bytes": source.stat().st_size,
                         "path": str(source)})
        except DefaultModelUnavailable:
            pass
    if args.json:
        print(json.dumps(rows, indent=2), file=out)
        return 0
    if not rows:
        print("no models here yet: tileinfer pull OWNER/NAME, or tileinfer import FILE.gguf",
              file=out)
    for r in rows:
        kind = f"pulled, {r['revision'][:12]}" if r["kind"] == "pulled" else r["kind"]
        print(f"{r['name']:<40} {kind:<32} {_size(r['size_bytes']):>9}  {r['path']}", file=out)
    return 0


def rm(args, out):
    from tileinfer.io.import_staging import clean_interrupted_imports
    from tileinfer.io.hub import remove_model
    from tileinfer.io.local_models import is_plain_name, local_model_dir, remove_local_model

    cleaned = clean_interrupted_imports()
    for folder, size in cleaned:
        print(f"removed the leftovers of an interrupted import: {folder.name} ({_size(size)})",
              file=out)
    from tileinfer.io.model_dir import gguf_reference

    if (reference := gguf_reference(args.name)) is not None:
        return _rm_pulled_gguf(args.name, *reference, out)
    if is_plain_name(args.name) and local_model_dir(args.name) is not None:
        if args.revision:
            raise UserError(f"{args.name} is an imported model: it has no revisions")
        freed = remove_local_model(args.name)
        print(f"removed {args.name} ({_size(freed)})", file=out)
        return 0
    if any(f.name.startswith(f".{args.name}.importing-") for f, _ in cleaned):
        return 0  # only the leftovers of its import were there
    from tileinfer.io.hub import HubError

    try:
        freed = remove_model(args.name, revision=args.revision)
    except HubError:
        if "/" in args.name:
            raise
        raise UserError(f"{args.name!r} is neither an imported model nor a pulled one "
                        "(tileinfer list shows the models here)") from None
    print(f"removed {args.name}" + (f" ({args.revision})" if args.revision else "")
          + f", {_size(freed)} freed", file=out)
    return 0


def _rm_pulled_gguf(name, repo, tag, out):
    """``rm OWNER/NAME:TAG``: the import of that pulled GGUF file; its download stays in the hub
    cache, with the repo's other files."""
    from tileinfer.io.hub import pulled_gguf
    from tileinfer.io.local_models import local_model_dir, remove_local_model
    from tileinfer.io.model_dir import imported_folder

    gguf = pulled_gguf(repo, tag)
    imported = imported_folder(gguf).name if gguf is not None else None
    if imported is None or local_model_dir(imported) is None:
        raise UserError(f"{name} is not pulled here (tileinfer list shows the models here)")
    freed = remove_local_model(imported)
    print(f"removed {imported}, the import of {name} ({_size(freed)}); the GGUF file stays in "
          f"the Hugging Face cache: tileinfer rm {repo} removes the repo's downloads", file=out)
    return 0


def import_(args, out):
    from pathlib import Path

    from tileinfer.io.gguf_import import import_gguf, is_current_import
    from tileinfer.io.import_record import imported_source
    from tileinfer.io.local_models import is_plain_name, local_model_dir

    path = Path(args.path).expanduser()
    name = args.name or path.stem
    existing = local_model_dir(name) if is_plain_name(name) else None
    if existing is not None and not args.force and path.is_file():
        if is_current_import(existing, path):
            print(f"{name} is already imported from {args.path} (in {existing}); --force "
                  "converts it again", file=out)
            return 0
        source = imported_source(existing) or "another file"
        raise UserError(f"a model named {name} exists already (from {source}): --name NAME "
                        "imports under another name, --force replaces it")
    folder = import_gguf(path, name=args.name)
    print(f"imported {args.path} as {folder.name} into {folder}", file=out)
    return 0
