"""docs/writing-a-backend.md's plugin module and pyproject.toml, copied as they are, build a wheel
whose entry point loads a backend the registry accepts."""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-backend.md"


def block(lang: str, first_line: str) -> str:
    for body in re.findall(rf"```{lang}\n(.*?)```", GUIDE.read_text(), re.S):
        if body.startswith(first_line):
            return body
    raise AssertionError(f"no ```{lang} block starting with {first_line!r} in {GUIDE}")


def test_the_guides_pyproject_builds_as_copied(tmp_path):
    # Before: the example lacked [build-system] and version; pip refused to build it.
    pytest.importorskip("hatchling")
    module = tmp_path / "src" / "tileinfer_backend_mine" / "__init__.py"
    module.parent.mkdir(parents=True)
    module.write_text(block("python", "# src/tileinfer_backend_mine/__init__.py"))
    (tmp_path / "pyproject.toml").write_text(block("toml", "# pyproject.toml"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "--no-index", "-q", "-w",
                            str(tmp_path / "dist"), str(tmp_path)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    wheel, = (tmp_path / "dist").glob("tileinfer_backend_mine-0.1.0-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "tileinfer_backend_mine/__init__.py" in names
    assert "[tileinfer]\nmine = tileinfer_backend_mine" in entry_points


def test_the_guides_module_is_a_valid_plugin(tmp_path, monkeypatch):
    from tileinfer.backend import registry

    (tmp_path / "guide_mine.py").write_text(block("python",
                                                  "# src/tileinfer_backend_mine/__init__.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import guide_mine

    backend = registry().register(guide_mine, name="mine")
    try:
        assert backend.error == "" and "rmsnorm" in backend.implemented
    finally:
        registry().unregister("mine")

