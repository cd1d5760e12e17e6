"""TileInfer backend of CUDA C++ kernels compiled at run time with NVRTC."""

from __future__ import annotations

from tileinfer.backends import BackendInfo
from tileinfer.hookspecs import hookimpl


def _availability():
    try:
        import torch
    except Exception as exc:  # pragma: no cover
        return False, f"torch is not importable: {exc!r}"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU"
    return True, ""


@hookimpl
def tileinfer_backend_info():
    available, reason = _availability()
    return BackendInfo(name="cuda", available=available, reason=reason, devices=("cuda",),
                       graph_safe=True)
