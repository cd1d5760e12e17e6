"""Where a command's start-up time goes: seconds since the process started, read from the
kernel's record of it (Linux), so that the interpreter's own start and the imports count too."""

from __future__ import annotations

import os
import time

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _seconds_since_start() -> float | None:
    """Seconds since this process started, or None off Linux. The kernel records the start in
    clock ticks after boot (field 22 of /proc/self/stat, on the boot-time clock); the boot-time
    clock now, less that, is the age (the boot time of /proc/stat, in whole seconds, would put up
    to a second of error in it)."""
    try:
        with open("/proc/self/stat") as f:
            # The command name (field 2) may hold spaces: fields after its closing parenthesis.
            fields = f.read().rsplit(")", 1)[1].split()
        now = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, IndexError, ValueError, AttributeError):
        return None
    return now - int(fields[19]) / _TICKS


_AGE = _seconds_since_start()
# time.perf_counter() at the moment the process started (to a clock tick).
_OFFSET = None if _AGE is None else time.perf_counter() - _AGE


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
