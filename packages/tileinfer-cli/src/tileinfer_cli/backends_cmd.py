"""``tileinfer backends``: the installed backends, whether they run here, and their fallbacks."""

from __future__ import annotations

from tileinfer.backend.registry import OP_NAMES, list_backends


def add_parser(sub):
    p = sub.add_parser("backends", help="list the installed op backends and whether they run here")
    p.set_defaults(func=run)


def run(args, out):
    for backend in list_backends():
        status = "available" if backend.available else f"unavailable: {backend.reason}"
        print(f"{backend.name:<8} {status}", file=out)
        if backend.info is None:
            continue
        print(f"         devices: {', '.join(backend.info.devices)};"
              f" CUDA graphs: {'yes' if backend.info.graph_safe else 'no'}", file=out)
        missing = [op for op in OP_NAMES if op not in backend.implemented]
        if backend.name != "ref":
            print(f"         ops: {len(OP_NAMES) - len(missing)}/{len(OP_NAMES)} own"
                  + (f"; from ref: {', '.join(missing)}" if missing else ""), file=out)
        for op, note in sorted(backend.info.notes.items()):
            print(f"         {op}: {note}", file=out)
    return 0
