"""``tileinfer backends``: the installed backends, whether they run here, and their fallbacks;
invalid plugins with the reason; names in TILEINFER_BACKENDS that are not installed."""

from __future__ import annotations


def add_parser(sub, formatter):
    p = sub.add_parser("backends", help="list the installed op backends and whether they run here",
                       formatter_class=formatter,
                       epilog="TILEINFER_BACKENDS=ref,NAME loads only those plugins.")
    p.set_defaults(func=run)


def run(args, out):
    from tileinfer.backend.registry import FALLBACK, OP_NAMES, OPTIONAL_OPS, list_backends

    for backend in list_backends():
        status = "available" if backend.available else f"unavailable: {backend.reason}"
        print(f"{backend.name:<8} {status}", file=out)
        if backend.source and backend.info is None:
            print(f"         from {backend.source}", file=out)
        if backend.info is None:
            continue
        print(f"         devices: {', '.join(backend.info.devices)};"
              f" CUDA graphs: {'yes' if backend.info.graph_safe else 'no'}", file=out)
        required = [op for op in OP_NAMES if op not in OPTIONAL_OPS]
        missing = [op for op in required if op not in backend.implemented]
        if backend.name != FALLBACK:
            optional = [op for op in OPTIONAL_OPS if op in backend.implemented]
            print(f"         ops: {len(required) - len(missing)}/{len(required)} own"
                  + (f"; from ref: {', '.join(missing)}" if missing else "")
                  + (f"; optional: {', '.join(optional)}" if optional else ""), file=out)
        for op, note in sorted(backend.info.notes.items()):
            print(f"         {op}: {note}", file=out)
    return 0
