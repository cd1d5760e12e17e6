"""Where a new ``tileinfer`` process spends its time: the main thread's stack sampled every 2 ms.

    python benchmarks/startup_stacks.py OUT.txt run -b triton --json -n 256 "Write a story."

runs ``tileinfer ARGS`` in this process (``import torch`` included) while a thread reads the main
thread's stack (``sys._current_frames``) every ``STACKS_PERIOD`` seconds (default 2 ms), each
sample weighted by the time since the one before. OUT.txt gets the seconds spent in each
function (``folder/file:name``, inclusive) and the tree of stack prefixes over 10 ms; import
machinery frames are left out, so an import shows as the imported module's ``<module>``.
Unlike cProfile it does not slow each call, so the parts keep their proportions.
"""

from __future__ import annotations

import collections
import os
import runpy
import sys
import threading
import time

PERIOD = float(os.environ.get("STACKS_PERIOD", "0.002"))


def frame_names(frame) -> tuple[str, ...]:
    """The stack from the outermost frame, as folder/file:function, import machinery left out."""
    names = []
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith("<frozen importlib"):
            names.append(f"{'/'.join(path.split('/')[-2:])}:{frame.f_code.co_name}")
        frame = frame.f_back
    return tuple(reversed(names))


def sample(main_id: int, stacks: collections.Counter, done: threading.Event):
    last = time.perf_counter()
    while not done.is_set():
        frame = sys._current_frames().get(main_id)
        now = time.perf_counter()
        stacks[frame_names(frame)] += now - last
        last = now
        time.sleep(PERIOD)


def report(stacks: collections.Counter, wall: float) -> str:
    inclusive, prefixes = collections.Counter(), collections.Counter()
    for stack, seconds in stacks.items():
        for name in set(stack):
            inclusive[name] += seconds
        for depth in range(1, len(stack) + 1):
            prefixes[stack[:depth]] += seconds
    lines = [f"wall {wall:.3f} s, sampled {sum(stacks.values()):.3f} s"]
    lines += [f"{seconds:8.3f} {name}" for name, seconds in inclusive.most_common(120)]
    lines.append("\n# stack prefixes over 10 ms")
    lines += [f"{seconds:8.3f} {'  ' * (len(stack) - 1)}{stack[-1]}"
              for stack, seconds in sorted(prefixes.items()) if seconds >= 0.01]
    return "\n".join(lines) + "\n"


def main():
    out, args = sys.argv[1], sys.argv[2:]
    stacks: collections.Counter = collections.Counter()
    done = threading.Event()
    sampler = threading.Thread(target=sample, daemon=True,
                               args=(threading.main_thread().ident, stacks, done))
    sampler.start()
    sys.argv = ["tileinfer", *args]
    start = time.perf_counter()
    try:
        runpy.run_module("tileinfer_cli", run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    finally:
        done.set()
        sampler.join()
        with open(out, "w") as f:
            f.write(report(stacks, time.perf_counter() - start))


if __name__ == "__main__":
    main()
