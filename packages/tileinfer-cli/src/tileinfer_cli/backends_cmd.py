"""``tileinfer backends``: the installed backends, whether they run here, and their fallbacks;
invalid plugins with the reason; names in TILEINFER_BACKENDS that are not installed.

A backend is listed as available only when it says so and one of its devices is present (a
plugin that runs on cuda only is unavailable on a machine without a GPU, whatever it says). A
name that several distributions claim is one entry, with a note for each plugin not used."""

from __future__ import annotations


def add_parser(sub, formatter):
    p = sub.add_parser("backends", help="list the installed op backends and whether they run here",
                       formatter_class=formatter,
                       epilog="TILEINFER_BACKENDS=ref,NAME loads only those plugins.")
    p.set_defaults(func=run)


def present_devices() -> set[str]:
    import torch

    return {"cpu"} | ({"cuda"} if torch.cuda.is_available() else set())


def status(backend, present) -> str:
    if not backend.available:
        return f"unavailable: {backend.reason}"
    devices = backend.info.devices
    if not set(devices) & present:
        return (f"unavailable: runs on {', '.join(devices)} (BackendInfo.devices) and none is "
                "present here")
    return "available"


def run(args, out):
    from tileinfer.backend.registry import FALLBACK, OP_NAMES, OPTIONAL_OPS, list_backends

    present = present_devices()
    listed = list_backends()
    names = [b.name for b in listed]
    shown = set()
    for backend in listed:
        if backend.name in shown:
            continue  # another claimant of a name already listed: a note there
        shown.add(backend.name)
        print(f"{backend.name:<8} {status(backend, present)}", file=out)
        if backend.source and backend.info is None:
            print(f"         from {backend.source}", file=out)
        if backend.info is not None:
            _details(backend, out, FALLBACK, OP_NAMES, OPTIONAL_OPS)
        if names.count(backend.name) > 1 and backend.info is not None:
            for other in listed:
                if other.name == backend.name and other is not backend:
                    print(f"         also claimed by {other.source or 'a registered plugin'}: "
                          f"not used (this one, {backend.source or 'registered'}, is)", file=out)
    return 0


def _details(backend, out, fallback, op_names, optional_ops):
    print(f"         devices: {', '.join(backend.info.devices)};"
          f" CUDA graphs: {'yes' if backend.info.graph_safe else 'no'}", file=out)
    required = [op for op in op_names if op not in optional_ops]
    missing = [op for op in required if op not in backend.implemented]
    if backend.name != fallback:
        optional = [op for op in optional_ops if op in backend.implemented]
        print(f"         ops: {len(required) - len(missing)}/{len(required)} own"
              + (f"; from ref: {', '.join(missing)}" if missing else "")
              + (f"; optional: {', '.join(optional)}" if optional else ""), file=out)
    for op, note in sorted(backend.info.notes.items()):
        print(f"         {op}: {note}", file=out)
