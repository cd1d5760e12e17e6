"""Shared fixtures: the fixtures folder beside the checkout, GPU skipping."""

from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the checkout (real configs and chat templates for tests)."""
    path = REPO.parent / "shared"
    if not (path / "fixtures").is_dir():
        pytest.skip(f"the shared fixtures folder {path} is absent")
    return path


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
