"""The conformance suite's fixtures: ``ops`` (the backend under test, from the ``backend_name``
parameter that the pytest plugin ``tileinfer.testing.plugin`` adds), ``ref`` and ``device``.

pytest loads this conftest when it collects the package (``--pyargs tileinfer.testing.conformance``);
``from tileinfer.testing.conformance import *`` takes the fixtures in with the tests.
"""

from __future__ import annotations

import pytest

from tileinfer.backend.registry import get_backend
from tileinfer.testing.plugin import runnable_device


@pytest.fixture
def ops(backend_name):
    """The op table of the backend under test."""
    return get_backend(backend_name)


@pytest.fixture
def ref():
    return get_backend("ref")


@pytest.fixture
def device(ops):
    chosen = runnable_device(ops.backend.info)
    if chosen is None:  # an available backend with no device present: a failure, not a skip
        pytest.fail(f"backend {ops.name!r} runs on {ops.backend.info.devices}, none of which "
                    "is present here")
    return chosen
