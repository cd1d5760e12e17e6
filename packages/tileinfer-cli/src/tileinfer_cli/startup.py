"""Where a command's start-up time goes: seconds since the process started, read from the
kernel's record of it (Linux), so that the interpreter's own start and the imports count too."""

from __future__ import annotations

import os
import time

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _process_start() -> float | None:
    """The process's start as a ``time.time()`` value (to a clock tick), or None off Linux."""
    try:
        with open("/proc/self/stat") as f:
            # The command name (field 2) may hold spaces: fields after its closing parenthesis.
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return boot + int(fields[19]) / _TICKS  # field 22: starttime, in clock ticks after boot


PROCESS_START = _process_start()
# time.perf_counter() at the moment the process started (approximately, to a clock tick).
_OFFSET = (time.perf_counter() - (time.time() - PROCESS_START)) if PROCESS_START else None


class Clock:
    """Named moments of a command, as perf_counter values; ``parts()`` gives the seconds
    between consecutive ones, starting from the process's start when it is known."""

    def __init__(self):
        self.marks: list[tuple[str, float]] = []

    def mark(self, name: str) -> float:
        now = time.perf_counter()
        self.marks.append((name, now))
        return now

    def since_start(self, at: float) -> float | None:
        """Seconds from the process's start to the perf_counter value ``at``."""
        return None if _OFFSET is None else at - _OFFSET

    def parts(self) -> dict[str, float]:
        """{name: seconds since the previous mark (the first: since the process started)}."""
        out, previous = {}, _OFFSET
        for name, at in self.marks:
            if previous is not None:
                out[name] = round(at - previous, 4)
            previous = at
        return out
