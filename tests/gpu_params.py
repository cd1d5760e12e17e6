"""Pytest parameters over the installed graph-safe CUDA backends (the tests of CUDA graphs)."""

import pytest


def gpu_backends(names=None):
    """The available graph-safe CUDA backends (of ``names``, if given), as pytest params marked
    gpu, or one skipped param when there is none."""
    from tileinfer.backend.registry import list_backends

    found = [b.name for b in list_backends() if b.available and "cuda" in b.info.devices
             and b.info.graph_safe and (names is None or b.name in names)]
    return [pytest.param(n, marks=pytest.mark.gpu) for n in found] or [
        pytest.param("none", marks=[pytest.mark.gpu,
                                    pytest.mark.skip(reason="no graph-safe GPU backend")])]
