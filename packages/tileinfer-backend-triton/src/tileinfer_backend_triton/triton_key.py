"""Triton's cache key, remembered between processes.

Triton keys its on-disk kernel cache with ``triton.runtime.cache.triton_key()``: a hash of its own
installation (its compiler's and language's sources and the whole libtriton.so), made once per
process before the first kernel is found on disk: a visible part of every new process's start
(benchmarks/RESULTS.md, 2026-12-03, "where a new process's start-up goes"). Here the key is kept in
TileInfer's home under a fingerprint of the same files (each one's path, size and modification
time, read with ``stat``; a reinstall or an edit changes it), and a process whose fingerprint
matches takes the stored key instead of hashing the installation again. Where anything fails
(another Triton layout, a home that cannot be written), Triton makes its key as it would have.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

STORE = "triton-key.json"  # in TileInfer's home: {"fingerprint": ..., "key": ...}


def _hashed_files(root: Path) -> list[Path]:
    """The files ``triton_key`` reads, and a few more beside them (any file under the folders it
    walks, but the bytecode caches that imports write: more only makes the fingerprint change
    more often)."""
    files = [root / "runtime" / "cache.py", *sorted((root / "_C").glob("libtriton.*"))]
    for folder in ("compiler", "backends", "language"):
        files += sorted(p for p in (root / folder).rglob("*")
                        if p.is_file() and "__pycache__" not in p.parts)
    return files


def files_fingerprint(root: Path, files, seed: str) -> str:
    """A hash of ``seed`` and each file's path (under root), size and modification time."""
    h = hashlib.sha256(seed.encode())
    for path in files:
        st = path.stat()
        h.update(f"\n{path.relative_to(root)} {st.st_size} {st.st_mtime_ns}".encode())
    return h.hexdigest()


def fingerprint(root: Path, version: str) -> str:
    """A hash of Triton's version and each hashed file's path, size and modification time."""
    return files_fingerprint(root, _hashed_files(root), version)


def write_store(store: Path, content: dict):
    """Write ``content`` as JSON to ``store`` whole, or not at all, for a process reading it
    meanwhile (nothing when the home cannot be written)."""
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        partial = store.with_name(f"{store.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(content))
        os.replace(partial, store)
    except OSError:
        pass


def remembered_key(make_key, root: Path, version: str, store: Path,
                   current: str | None = None) -> str:
    """The key stored under the installation's fingerprint (``current``, made here when not
    given), else ``make_key()`` (stored for the next process)."""
    current = current or fingerprint(root, version)
    try:
        stored = json.loads(store.read_text())
        if stored.get("fingerprint") == current and isinstance(stored.get("key"), str):
            return stored["key"]
    except (OSError, ValueError, AttributeError):
        pass
    key = make_key()
    write_store(store, {"fingerprint": current, "key": key})
    return key


def install_remembered_key() -> str | None:
    """Make Triton's ``triton_key`` the remembered one for this process (and the key itself
    now, so that the first kernel launch finds it made); the installation's fingerprint, or
    None where it could not be made."""
    import triton
    from triton.runtime import cache

    from tileinfer.io.paths import tileinfer_home

    original = getattr(cache, "triton_key", None)
    if original is None:  # another Triton layout: its first launch makes its key
        return None
    root = Path(triton.__file__).parent
    try:
        current = fingerprint(root, triton.__version__)
        key = remembered_key(original, root, triton.__version__, tileinfer_home() / STORE,
                             current)
    except (OSError, ValueError):  # a file vanished while read, a home that is a file
        original()
        return None

    @functools.lru_cache
    def triton_key():
        return key

    cache.triton_key = triton_key  # get_cache_key reads the module's name at each call
    return current
