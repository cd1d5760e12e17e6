"""The shipped conformance suite, run for every available backend (ref; triton under
TRITON_INTERPRET=1 on the CPU; all of them on a GPU)."""

import importlib
import inspect
import os

import tileinfer.testing.conformance as conformance
from tileinfer.testing.conformance import *  # noqa: F401,F403

MODULES = ("test_norms", "test_linear", "test_attention", "test_sampling", "test_scratch",
           "test_batch_invariance", "test_linear_fp8", "test_e4m3_input")


def test_every_conformance_test_is_exported():
    """``import *`` (this file) takes in the same tests as ``pytest --pyargs`` collects."""
    defined = set()
    for name in MODULES:
        module = importlib.import_module(f"tileinfer.testing.conformance.{name}")
        defined |= {n for n, f in vars(module).items() if n.startswith("test_")
                    and inspect.isfunction(f) and f.__module__ == module.__name__}
    exported = {n for n in conformance.__all__ if n.startswith("test_")}
    assert defined == exported
    package_dir = conformance.__path__[0]
    shipped = {f[:-3] for f in os.listdir(package_dir) if f.startswith("test_") and f.endswith(".py")}
    assert shipped == set(MODULES), "a new test module must be listed here and in __init__"
