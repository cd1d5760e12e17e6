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


def pytest_generate_tests(metafunc):
    if "backend_name" in metafunc.fixturenames:
        metafunc.parametrize("backend_name", _selected_backends(metafunc.config))
