"""The example third-party backend (examples/tileinfer-backend-example), installed the way a
user installs it (pip, into a folder put on PYTHONPATH), and deliberately broken copies of it:
the registry or the conformance suite must name the broken op. CI runs the whole conformance
suite on the unbroken package (.ci/run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "tileinfer-backend-example"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The example installed with pip into a folder of its own (its entry point included)."""
    target = tmp_path_factory.mktemp("example-site")
    result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                             "--disable-pip-version-check", "--target", str(target),
                             str(EXAMPLE)], capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        pytest.fail(f"pip could not install the example backend:\n{result.stderr}")
    return target


def module_file(site) -> Path:
    return site / "tileinfer_backend_example" / "__init__.py"


def write_module(site, text):
    """Replace the installed module's source (and its bytecode, which a same-size edit within
    the same second would leave looking current)."""
    module_file(site).write_text(text)
    for pyc in (site / "tileinfer_backend_example" / "__pycache__").glob("*.pyc"):
        pyc.unlink()


@pytest.fixture
def example(site):
    """The installed module's source; restored after the test."""
    original = module_file(site).read_text()
    yield original
    write_module(site, original)


def run(site, *args, cwd):
    env = {**os.environ, "PYTHONPATH": str(site)}
    env.pop("TILEINFER_BACKENDS", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd)


def conformance(site, cwd, select):
    return run(site, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               "--pyargs", "tileinfer.testing.conformance", "--tileinfer-backend", "example",
               "-k", select, cwd=cwd)


def test_example_is_found_and_passes_conformance(site, example, tmp_path):
    listed = run(site, "-m", "tileinfer_cli", "backends", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "example  available" in listed.stdout
    assert "ops: 4/13 own" in listed.stdout
    result = conformance(site, tmp_path, "rmsnorm or test_linear or embed")
    assert result.returncode == 0, result.stdout[-3000:]
    assert " passed" in result.stdout.splitlines()[-1]


def test_copy_with_arguments_in_another_order_is_rejected_naming_the_op(site, example, tmp_path):
    broken = example.replace("def rmsnorm(out, x, weight, eps):",
                             "def rmsnorm(out, weight, x, eps):")
    assert broken != example
    write_module(site, broken)
    message = "op 'rmsnorm' takes (out, weight, x, eps); the spec is (out, x, weight, eps)"
    listed = run(site, "-m", "tileinfer_cli", "backends", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr  # one bad plugin never stops the command
    assert "example  unavailable: invalid plugin 'example': " + message in listed.stdout
    assert "ref      available" in listed.stdout
    result = conformance(site, tmp_path, "rmsnorm")
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


def test_copy_with_a_wrong_result_fails_conformance_naming_the_op(site, example, tmp_path):
    # rmsnorm that forgets the weight: every rmsnorm case fails, the other ops still pass.
    broken = example.replace("out.copy_(_rms(x, weight, eps, out.dtype))",
                             "out.copy_(_rms(x, torch.ones_like(weight), eps, out.dtype))")
    assert broken != example
    write_module(site, broken)
    result = conformance(site, tmp_path, "rmsnorm or embed")
    assert result.returncode == 1
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
    assert failed and all("test_rmsnorm[" in line for line in failed), result.stdout[-3000:]
    assert "passed" in result.stdout.splitlines()[-1]  # embed still passes
