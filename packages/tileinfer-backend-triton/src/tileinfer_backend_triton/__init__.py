"""TileInfer backend of Triton kernels.

On a machine without a CUDA GPU it is available only under Triton's interpreter
(``TRITON_INTERPRET=1``, which CI uses to check the kernels on the CPU).
"""

from __future__ import annotations

import os

from tileinfer.backends import BackendInfo
from tileinfer.hookspecs import hookimpl


def _availability():
    try:
        import torch
        import triton  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on the machine
        return False, f"triton is not importable: {exc!r}", ("cuda",)
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True, "", ("cpu",)
    if not torch.cuda.is_available():
        return False, "no CUDA GPU (set TRITON_INTERPRET=1 to run the kernels on the CPU)", ("cuda",)
    return True, "", ("cuda",)


@hookimpl
def tileinfer_backend_info():
    available, reason, devices = _availability()
    return BackendInfo(name="triton", available=available, reason=reason, devices=devices,
                       graph_safe=True)
