"""Run a module or script with the CUDA backend's tuning tables changed in this process only:
per-weight entries that the experiment switch (TILEINFER_CUDA_EXPERIMENTS, which applies one
setting to every weight) cannot give, e.g. one weight's order of its sums.

    python benchmarks/with_tables.py PATCH.json -m tileinfer_cli bench --shape llama3-8b \\
        --backend cuda --deterministic
    python benchmarks/with_tables.py PATCH.json benchmarks/invariant_rows.py --rows 1,1024

PATCH.json: {"module.TABLE": {"rows,K,int8,epilogue": entry or null, ...}, ...}, the module
under tileinfer_backend_cuda.ops; a key's fields are the table's key (int8 as 0/1; tables keyed
by a fifth field take it too), an entry replaces the table's (null drops it). For example
{"invariant_tuning.INVARIANT_ORDER": {"14336,4096,0,swiglu": {"parts": 2, "blocked": true,
"nk": true}}}: gate/up's sums in two contiguous parts in both kernels.
"""

from __future__ import annotations

import importlib
import json
import runpy
import sys


def table_key(text: str) -> tuple:
    """"14336,4096,0,swiglu" -> (14336, 4096, False, "swiglu"): ints stay ints, the third field
    (int8) a bool."""
    fields = [int(f) if f.lstrip("-").isdigit() else f for f in text.split(",")]
    if len(fields) >= 3:
        fields[2] = bool(fields[2])
    return tuple(fields)


def apply(patch: dict) -> None:
    for name, entries in patch.items():
        module_name, table_name = name.rsplit(".", 1)
        table = getattr(importlib.import_module(f"tileinfer_backend_cuda.ops.{module_name}"),
                        table_name)
        for text, entry in entries.items():
            key = table_key(text)
            if entry is None:
                table.pop(key, None)
            else:
                table[key] = entry
            print(f"with_tables: {name}[{key}] = {entry}", file=sys.stderr)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        apply(json.load(f))
    if sys.argv[2] == "-m":
        sys.argv = [sys.argv[3]] + sys.argv[4:]
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        sys.argv = sys.argv[2:]
        runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
