"""Where the installed backends are declared: entry points of the group ``tileinfer``.

Reading every installed distribution's entry points (``importlib.metadata.entry_points``)
takes a new process tens of milliseconds on an image with hundreds of packages; a backend of
our own, ``tileinfer-backend-NAME``, is found by its distribution's name instead
(``own_entry_point``), and the full scan (``entry_points_by_name``) waits until every backend
must be known (a listing, an unknown name).
"""

from __future__ import annotations

import importlib.metadata

ENTRY_POINT_GROUP = "tileinfer"


def dist_name(ep) -> str:
    dist = getattr(ep, "dist", None)
    return dist.metadata["Name"] if dist is not None else ""


def is_own(ep, name: str) -> bool:
    """Whether the entry point comes from our distribution of backend ``name``."""
    return dist_name(ep).lower().replace("_", "-") == f"tileinfer-backend-{name}"


def where_from(ep) -> str:
    dist = getattr(ep, "dist", None)
    where = f"{dist.metadata['Name']} {dist.version}: " if dist is not None else ""
    return f"{where}entry point {ep.name} = {ep.value}"


def entry_points_by_name():
    """name -> the distinct entry points of the group that claim it."""
    by_name: dict[str, list] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        eps = by_name.setdefault(ep.name, [])
        # The same distribution seen twice on sys.path is one entry point.
        if not any(e.value == ep.value and dist_name(e) == dist_name(ep) for e in eps):
            eps.append(ep)
    return by_name


def own_entry_point(name: str):
    """The entry point ``name`` of our own distribution ``tileinfer-backend-NAME``, found by its
    name alone (None if it is not installed or declares no such entry point)."""
    try:
        dist = importlib.metadata.distribution(f"tileinfer-backend-{name}")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    for ep in dist.entry_points:
        if ep.group == ENTRY_POINT_GROUP and ep.name == name:
            return ep
    return None
