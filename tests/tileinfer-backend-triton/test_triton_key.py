"""Triton's cache key remembered between processes (triton_key.py): taken from the store while
the installation's files are unchanged, made again when one changes."""

from __future__ import annotations

import json
import os

from tileinfer_backend_triton.triton_key import remembered_key


def _installation(root):
    for rel, text in (("runtime/cache.py", "x"), ("_C/libtriton.so", "lib"),
                      ("compiler/compiler.py", "c"), ("backends/nvidia/driver.py", "d"),
                      ("language/core.py", "l")):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_key_is_made_once_and_again_after_a_file_changes(tmp_path):
    root, store = tmp_path / "triton", tmp_path / "home" / "triton-key.json"
    _installation(root)
    made = []

    def make_key():
        made.append(1)
        return f"key{len(made)}"

    assert remembered_key(make_key, root, "3.6.0", store) == "key1"
    assert json.loads(store.read_text())["key"] == "key1"
    assert remembered_key(make_key, root, "3.6.0", store) == "key1" and len(made) == 1
    # Another version, an edited library, a touched source: each makes the key anew.
    assert remembered_key(make_key, root, "3.7.0", store) == "key2"
    (root / "_C/libtriton.so").write_text("another lib")
    assert remembered_key(make_key, root, "3.7.0", store) == "key3"
    source = root / "language/core.py"
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))
    assert remembered_key(make_key, root, "3.7.0", store) == "key4"
    assert remembered_key(make_key, root, "3.7.0", store) == "key4" and len(made) == 4
    # Bytecode caches written by imports are not part of the installation.
    (root / "compiler/__pycache__").mkdir()
    (root / "compiler/__pycache__/compiler.cpython-312.pyc").write_bytes(b"\0")
    assert remembered_key(make_key, root, "3.7.0", store) == "key4" and len(made) == 4


def test_a_broken_or_unwritable_store_falls_back_to_making_the_key(tmp_path):
    root = tmp_path / "triton"
    _installation(root)
    store = tmp_path / "triton-key.json"
    store.write_text("{not json")
    assert remembered_key(lambda: "made", root, "3.6.0", store) == "made"
    assert json.loads(store.read_text())["key"] == "made"  # replaced by a good one
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert remembered_key(lambda: "made", root, "3.6.0", blocked / "triton-key.json") == "made"
