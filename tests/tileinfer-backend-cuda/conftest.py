"""Fixtures of the CUDA backend's GPU tests: the cuda and ref op tables."""

from __future__ import annotations

import pytest
import torch
from tileinfer.backend.registry import get_backend


@pytest.fixture(scope="module")
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return get_backend("cuda")


@pytest.fixture(scope="module")
def ref():
    return get_backend("ref")
