"""Build and run a C++ check of a kernel header's integer arithmetic on the host (the device
qualifiers defined away by the check itself), with the system's C++ compiler."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tileinfer_backend_cuda.compiler import KERNEL_DIR


def run_host_check(tmp_path, source: str, *flags: str) -> None:
    """Compile `source` against the kernel directory with `flags` and run it: it must print 0
    (its count of failures) and exit 0. Skips where the machine has no C++ compiler."""
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler on this machine")
    path = tmp_path / "check.cpp"
    path.write_text(source)
    binary = tmp_path / "check"
    subprocess.run([compiler, "-std=c++17", "-O1", f"-I{KERNEL_DIR}", *flags, "-o", str(binary),
                    str(path)], check=True, capture_output=True)
    result = subprocess.run([str(binary)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "0", result.stdout
