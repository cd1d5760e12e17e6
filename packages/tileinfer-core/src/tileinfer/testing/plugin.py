"""pytest plugin (entry point ``pytest11``): the ``--tileinfer-backend`` option and the
``backend_name`` parameter of the conformance suite."""

from __future__ import annotations


def pytest_addoption(parser):
    parser.addoption(
        "--tileinfer-backend", action="append", default=[], metavar="NAME",
        help="run the TileInfer conformance suite for this backend (repeatable); "
             "default: every available backend",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped where none is present")


def _selected_backends(config) -> list[str]:
    chosen = config.getoption("--tileinfer-backend")
    if chosen:
        return chosen
    from tileinfer.backend.registry import list_backends

    return [b.name for b in list_backends() if b.available]


def runnable_device(info):
    """The device the conformance suite runs a backend on: cuda when it runs there and a GPU is
    present, else the CPU if it runs there, else None."""
    import torch

    if "cuda" in info.devices and torch.cuda.is_available():
        return torch.device("cuda")
    if "cpu" in info.devices:
        return torch.device("cpu")
    return None


def pytest_sessionstart(session):
    """A backend named with --tileinfer-backend that cannot run here stops the run with the
    reason: a conformance run that skipped every case would look like a pass."""
    import pytest

    chosen = session.config.getoption("--tileinfer-backend")
    if not chosen:
        return
    from tileinfer.backend.registry import BackendError, get_backend

    for name in chosen:
        try:
            info = get_backend(name).backend.info
        except BackendError as exc:
            raise pytest.UsageError(f"conformance: {exc}") from None
        if runnable_device(info) is None:
            raise pytest.UsageError(
                f"conformance: backend {name!r} runs on {', '.join(info.devices) or 'no device'}, "
                "none of which is present here (is BackendInfo.devices right?)")


def pytest_generate_tests(metafunc):
    if "backend_name" in metafunc.fixturenames:
        metafunc.parametrize("backend_name", _selected_backends(metafunc.config))
