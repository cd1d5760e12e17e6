"""The conformance suite's fixtures: ``ops`` (the backend under test, from the ``backend_name``
parameter that the pytest plugin ``tileinfer.testing.plugin`` adds), ``ref`` and ``device``.

pytest loads this conftest when it collects the package (``--pyargs tileinfer.testing.conformance``);
``from tileinfer.testing.conformance import *`` takes the fixtures in with the tests.
"""

from __future__ import annotations

import pytest
import torch

from tileinfer.backend.registry import get_backend


@pytest.fixture
def ops(backend_name):
    """The op table of the backend under test."""
    return get_backend(backend_name)


@pytest.fixture
def ref():
    return get_backend("ref")


@pytest.fixture
def device(ops):
    devices = ops.backend.info.devices
    if "cuda" in devices and torch.cuda.is_available():
        return torch.device("cuda")
    if "cpu" in devices:
        return torch.device("cpu")
    pytest.skip(f"backend {ops.name!r} runs on {devices}, not available here")
