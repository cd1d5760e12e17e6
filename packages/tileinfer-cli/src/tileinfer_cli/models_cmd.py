"""``tileinfer pull | list | rm | import``: the local model cache."""

from __future__ import annotations


def add_parser(sub):
    p = sub.add_parser("pull", help="download a model's inference files from the Hugging Face hub")
    p.add_argument("repo_id")
    p.add_argument("--revision", default="main")
    p.set_defaults(func=pull)

    p = sub.add_parser("list", help="list pulled and imported models")
    p.set_defaults(func=list_)

    p = sub.add_parser("rm", help="remove a pulled model (all revisions, or --revision)")
    p.add_argument("repo_id")
    p.add_argument("--revision")
    p.set_defaults(func=rm)

    p = sub.add_parser("import", help="import a GGUF file as a model folder in the local cache")
    p.add_argument("path")
    p.add_argument("--name", help="folder name (default: the file's name)")
    p.set_defaults(func=import_)


def pull(args, out):
    from tileinfer.io.hub import pull

    path = pull(args.repo_id, revision=args.revision)
    print(f"pulled {args.repo_id} ({args.revision}) into {path}", file=out)
    return 0


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def list_(args, out):
    from tileinfer.io.hub import list_models

    models = list_models()
    if not models:
        print("no models pulled yet: tileinfer pull REPO_ID", file=out)
    for m in models:
        print(f"{m.repo_id:<48} {m.revision[:12]:<12} {_size(m.size_bytes):>10}  {m.path}", file=out)
    return 0


def rm(args, out):
    from tileinfer.io.hub import remove_model

    remove_model(args.repo_id, revision=args.revision)
    print(f"removed {args.repo_id}" + (f" ({args.revision})" if args.revision else ""), file=out)
    return 0


def import_(args, out):
    from tileinfer.io.gguf_import import import_gguf

    path = import_gguf(args.path, name=args.name)
    print(f"imported {args.path} into {path}", file=out)
    return 0
