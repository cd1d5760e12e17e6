"""The conformance run refuses a backend it could not test, instead of skipping every case."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

REGISTER = """
import torch
from tileinfer.backend import BackendInfo, hookimpl, registry


class CpuBackendWithDefaultDevices:
    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="cpuonly", available=True)  # devices defaults to ("cuda",)

    @hookimpl
    def rmsnorm(self, out, x, weight, eps):
        raise AssertionError("never called: the run stops before any test")


registry().register(CpuBackendWithDefaultDevices(), "cpuonly")
"""


def _conformance(tmp_path, backend):
    (tmp_path / "register_cpuonly.py").write_text(textwrap.dedent(REGISTER))
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "register_cpuonly", "-p", "no:cacheprovider", "-q",
         "--pyargs", "tileinfer.testing.conformance", "--tileinfer-backend", backend],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the backend's cuda is present on a GPU")
def test_a_backend_without_a_present_device_fails_the_run(tmp_path):
    result = _conformance(tmp_path, "cpuonly")
    assert result.returncode != 0
    assert "backend 'cpuonly' runs on cuda, none of which is present here" in result.stderr


def test_an_unknown_backend_fails_the_run(tmp_path):
    result = _conformance(tmp_path, "nosuch")
    assert result.returncode != 0
    assert "unknown backend 'nosuch'" in result.stderr
