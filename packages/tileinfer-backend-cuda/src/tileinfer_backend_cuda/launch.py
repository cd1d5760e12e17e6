"""Kernel launches that keep the GIL: cuLaunchKernel / cuLaunchKernelEx through ``ctypes.PyDLL``.

cuda.bindings releases the GIL around every driver call. A thread that launches hundreds of
kernels (an eager step of a model) then takes the GIL back hundreds of times, and while another
thread runs Python (a server's event loop) each time can cost it up to the interpreter's switch
interval. A launch only queues work (a few microseconds), so holding the GIL through it is
cheaper. The structures are cuda.h's ``CUlaunchAttribute`` and ``CUlaunchConfig``.
"""

from __future__ import annotations

import ctypes
import threading


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute (cuda.h): the id, padding to 8 bytes, a 64-byte value union whose
    first int is the programmatic stream serialization flag."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int),
                ("value_pad", ctypes.c_char * 60)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h)."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class GILLauncher:
    """``launch(...)``: cuLaunchKernel, or with pdl cuLaunchKernelEx with the programmatic stream
    serialization attribute (a config per thread, refilled per launch); returns the CUresult."""

    def __init__(self, lib):
        u, p = ctypes.c_uint, ctypes.c_void_p
        self._launch = lib.cuLaunchKernel
        self._launch.argtypes = [p, u, u, u, u, u, u, u, p, p, p]
        self._launch.restype = ctypes.c_int
        self._launch_ex = lib.cuLaunchKernelEx
        self._launch_ex.argtypes = [ctypes.POINTER(_LaunchConfig), p, p, p]
        self._launch_ex.restype = ctypes.c_int
        self._local = threading.local()

    def _config(self):
        config = getattr(self._local, "config", None)
        if config is None:
            attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION, value=1)
            config = self._local.config = _LaunchConfig(attrs=ctypes.pointer(attr), numAttrs=1)
            self._local.attr = attr  # kept alive with the config
        return config

    def launch(self, function, gx, gy, gz, bx, by, bz, smem, stream, params, pdl) -> int:
        if not pdl:
            return self._launch(function, gx, gy, gz, bx, by, bz, smem, stream, params, None)
        c = self._config()
        c.gridDimX, c.gridDimY, c.gridDimZ = gx, gy, gz
        c.blockDimX, c.blockDimY, c.blockDimZ = bx, by, bz
        c.sharedMemBytes, c.hStream = smem, stream
        return self._launch_ex(ctypes.byref(c), function, params, None)


_instance: GILLauncher | None | bool = None


def gil_launcher() -> GILLauncher | None:
    """The GIL-holding launcher, or None where libcuda cannot be opened that way (then the
    launches go through cuda.bindings)."""
    global _instance
    if _instance is None:
        try:
            _instance = GILLauncher(ctypes.PyDLL("libcuda.so.1"))
        except (OSError, AttributeError):
            _instance = False
    return _instance or None
