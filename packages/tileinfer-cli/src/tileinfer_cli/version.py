"""``tileinfer --version``: every installed TileInfer distribution and every backend plugin, read
from the installed metadata (nothing is imported)."""

from __future__ import annotations

import importlib.metadata as md
import platform

GROUP = "tileinfer"  # the backends' entry-point group


def version_text() -> str:
    lines = []
    backends = {}  # distribution name -> backend names
    for ep in md.entry_points(group=GROUP):
        dist = ep.dist.metadata["Name"] if ep.dist is not None else "?"
        backends.setdefault(dist, set()).add(ep.name)
    seen = set()
    for dist in sorted(md.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        name = dist.metadata["Name"] or ""
        if name.lower() in seen:
            continue
        if name.lower().startswith("tileinfer") or name in backends:
            seen.add(name.lower())
            names = sorted(backends.get(name, ()))
            suffix = f"  (backend{'s' if len(names) > 1 else ''}: {', '.join(names)})" if names else ""
            lines.append(f"{name} {dist.version}{suffix}")
    try:
        torch = f"torch {md.version('torch')}"
    except md.PackageNotFoundError:
        torch = "torch not installed"
    lines.append(f"{torch}; Python {platform.python_version()}")
    return "\n".join(lines)
