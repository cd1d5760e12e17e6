"""Run-time compilation of the package's CUDA C++ kernels and their launch on PyTorch's stream.

Kernels are ``.cu`` files in ``kernels/`` (package data). ``compile_cubin`` compiles one file with
NVRTC (``cuda.bindings.nvrtc``) straight to a cubin for the GPU's architecture (``-arch=sm_90`` on
an H200): never to PTX, since PTX from an NVRTC newer than the driver cannot be loaded. Variants
are made with ``-D`` defines (head_dim, dtypes, tile sizes); a build that defines
``ARCH_SPECIFIC`` is compiled for the architecture's arch-specific target (``sm_90a``: wgmma).
Cubins are cached on disk under ``$TILEINFER_CACHE`` (default ``~/.cache/tileinfer/cuda``), keyed
by a hash of the source, the shared header, the options, the NVRTC version and the architecture.

``load_module`` loads a cubin once per process and device with the driver API
(``cuModuleLoadData``); ``Kernel.launch`` calls ``cuLaunchKernel`` on
``torch.cuda.current_stream()`` with tensors' ``data_ptr()``, so launches made while a stream is
being captured land in the CUDA graph. The launch itself goes through ``ctypes.PyDLL`` on
libcuda, which keeps the GIL during the call (``launch.py``: why), and through cuda.bindings
where that library cannot be opened. The kernels include no CUDA toolkit header (bf16 is
handled as bit patterns in ``kernels/common.cuh``), so only the NVRTC library is needed.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from .launch import gil_launcher

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
HEADER_NAMES = ("common.cuh", "attention_tiles.cuh", "attention_decode_defines.cuh",
                "attention_decode_smem.cuh", "attention_decode_merge.cuh",
                "attention_decode_mma.cuh", "head_vector.cuh", "fp8.cuh", "gemv_frag.cuh",
                "gemv_epilogue.cuh", "gemv_parts.cuh", "gemv_nk.cuh", "gemm_wgmma_layout.cuh",
                "gemm_store.cuh", "sampling_block.cuh", "tma.cuh", "wgmma.cuh",
                "gemm_wgmma_block.cuh")
# Bumped when the way cubins are built changes in a way the key does not see.
CACHE_FORMAT = 1
BASE_OPTIONS = ("-std=c++17", "-default-device")


class CompileError(RuntimeError):
    """A kernel file failed to compile; the message holds the file name and the NVRTC log."""


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


def _nvrtc():
    from cuda.bindings import nvrtc

    return nvrtc


def _driver():
    from cuda.bindings import driver

    return driver


def _check_nvrtc(result, what):
    nvrtc = _nvrtc()
    err = result[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {err!r}")
    return result[1] if len(result) == 2 else result[1:]


def _check(result, what):
    driver = _driver()
    err = result[0] if isinstance(result, tuple) else result
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise CudaError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    if isinstance(result, tuple):
        return result[1] if len(result) == 2 else result[1:]
    return None


def nvrtc_version() -> tuple[int, int]:
    major, minor = _check_nvrtc(_nvrtc().nvrtcVersion(), "nvrtcVersion")
    return int(major), int(minor)


def supported_archs() -> list[int]:
    """The SM versions this NVRTC can compile for, e.g. [75, 80, ..., 90, 100, 120]."""
    return [int(a) for a in _check_nvrtc(_nvrtc().nvrtcGetSupportedArchs(), "nvrtcGetSupportedArchs")]


def arch_for(capability: tuple[int, int]) -> str:
    """The ``sm_XY`` to compile for on a GPU of this compute capability.

    A cubin runs on GPUs of the same major version and an equal or higher minor one, so when
    NVRTC does not know the exact SM, the highest one of the same major below it is used.
    """
    major, minor = capability
    want = major * 10 + minor
    archs = supported_archs()
    same_major = [a for a in archs if a // 10 == major and a <= want]
    if not same_major:
        raise CompileError(f"this NVRTC ({'.'.join(map(str, nvrtc_version()))}) cannot compile "
                           f"for sm_{want}; it supports {archs}")
    return f"sm_{max(same_major)}"


def cache_dir() -> Path:
    root = os.environ.get("TILEINFER_CACHE")
    if root:
        return Path(root).expanduser() / "cuda"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tileinfer" / "cuda"


def read_source(file: str) -> str:
    return (KERNEL_DIR / file).read_text()


def _headers() -> dict[str, str]:
    return {name: read_source(name) for name in HEADER_NAMES}


def build_options(arch: str, defines: dict | None = None, extra: tuple = ()) -> list[str]:
    if defines and "ARCH_SPECIFIC" in defines and not arch.endswith("a"):
        arch += "a"  # the build uses the GPU's arch-specific instructions (wgmma: sm_90a)
    opts = [f"-arch={arch}", *BASE_OPTIONS, *extra]
    for key in sorted(defines or {}):
        value = defines[key]
        opts.append(f"-D{key}" if value is None else f"-D{key}={value}")
    return opts


def cache_key(file: str, options: list[str]) -> str:
    h = hashlib.sha256()
    for part in (f"format={CACHE_FORMAT}", f"nvrtc={nvrtc_version()}", file, read_source(file),
                 *(f"{n}\n{s}" for n, s in sorted(_headers().items())), *options):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_source(name: str, source: str, options: list[str],
                   headers: dict[str, str] | None = None) -> bytes:
    """Compile CUDA C++ source to a cubin with NVRTC; raises CompileError with the log."""
    nvrtc = _nvrtc()
    headers = _headers() if headers is None else headers
    prog = _check_nvrtc(nvrtc.nvrtcCreateProgram(
        source.encode(), name.encode(), len(headers), [s.encode() for s in headers.values()],
        [n.encode() for n in headers]), "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log_size = _check_nvrtc(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        # Mutable buffers: NVRTC writes into them (a bytes object may be an interned constant).
        log = bytearray(log_size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        log = bytes(log).rstrip(b"\0 ").decode(errors="replace")
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise CompileError(f"NVRTC failed to compile {name} ({' '.join(options)}):\n{log}")
        size = _check_nvrtc(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        if size == 0:
            raise CompileError(f"NVRTC produced no cubin for {name}; options {options} "
                               "must name a real architecture (-arch=sm_XY)")
        cubin = bytearray(size)
        _check_nvrtc(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@dataclass
class CompileStats:
    compiled: int = 0
    cache_hits: int = 0


stats = CompileStats()
_compile_lock = threading.Lock()


def compile_cubin(file: str, arch: str, defines: dict | None = None, extra_options: tuple = (),
                  use_cache: bool = True) -> bytes:
    """The cubin of kernel file ``file`` for ``arch`` with ``defines``, from the disk cache if
    an identical build is there."""
    options = build_options(arch, defines, extra_options)
    key = cache_key(file, options)
    path = cache_dir() / f"{Path(file).stem}-{arch}-{key[:32]}.cubin"
    with _compile_lock:
        if use_cache and path.is_file():
            stats.cache_hits += 1
            return path.read_bytes()
        cubin = compile_source(file, read_source(file), options)
        stats.compiled += 1
        if use_cache:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
                with os.fdopen(fd, "wb") as f:
                    f.write(cubin)
                os.replace(tmp, path)  # atomic: concurrent processes see a whole file or none
            except OSError:
                pass  # a read-only cache directory only costs a recompile next time
        return cubin


# --- loading and launching ----------------------------------------------------------------------

_tls = threading.local()
_init_lock = threading.Lock()
_initialized = False
_primary_contexts: dict[int, object] = {}


def _ensure_context(device_index: int):
    """Make the device's primary context (the one PyTorch uses) current in this thread."""
    if getattr(_tls, "device", None) == device_index:
        return
    global _initialized
    driver = _driver()
    with _init_lock:
        if not _initialized:
            _check(driver.cuInit(0), "cuInit")
            _initialized = True
        ctx = _primary_contexts.get(device_index)
        if ctx is None:
            dev = _check(driver.cuDeviceGet(device_index), "cuDeviceGet")
            ctx = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _primary_contexts[device_index] = ctx
    current = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(current) != int(ctx):
        _check(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    _tls.device = device_index


# Kernel argument kinds: p = pointer (tensor, int address or None), i = int32, q = int64,
# f = float32, m = a tensor map by value (16 unsigned 64-bit words: a __grid_constant__ one).
_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int32, "q": ctypes.c_int64, "f": ctypes.c_float,
           "m": ctypes.c_uint64 * 16}


class Kernel:
    """One ``extern "C"`` kernel of a loaded module, launched with ``kernel.launch(grid, block,
    args, smem)``. ``signature`` gives the argument kinds in order (see ``_CTYPES``)."""

    def __init__(self, module: "Module", name: str, function, signature: str):
        self.module = module
        self.name = name
        self.function = function
        self.function_ptr = int(function)  # the CUfunction handle as an address
        self.signature = signature
        self._local = threading.local()
        # The dynamic shared memory this kernel has been allowed so far. Without the opt-in a
        # block may use 48 KB in all, static included, so any dynamic size is opted in once.
        self._max_dynamic_smem = 0

    def _arg_buffers(self):
        bufs = getattr(self._local, "bufs", None)
        if bufs is None:
            values = [_CTYPES[k]() for k in self.signature]
            ptrs = (ctypes.c_void_p * max(1, len(values)))(
                *[ctypes.addressof(v) for v in values])
            bufs = self._local.bufs = (values, ptrs, ctypes.addressof(ptrs))
        return bufs

    def set_max_dynamic_smem(self, nbytes: int):
        if nbytes > self._max_dynamic_smem:
            driver = _driver()
            _check(driver.cuFuncSetAttribute(
                self.function,
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                nbytes), f"cuFuncSetAttribute({self.name})")
            self._max_dynamic_smem = nbytes

    def launch(self, grid, block, args, smem: int = 0, stream=None, pdl: bool = False):
        """pdl: launch with programmatic stream serialization (cuLaunchKernelEx): the kernel may
        start before the previous kernel on the stream has finished, and must call pdl_wait()
        (common.cuh) before touching what that kernel reads or writes."""
        import torch

        if len(args) != len(self.signature):
            raise TypeError(f"{self.name} takes {len(self.signature)} arguments, got {len(args)}")
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        if gx <= 0 or gy <= 0 or gz <= 0:
            return  # nothing to do (an empty step)
        bx, by, bz = (tuple(block) + (1, 1))[:3]
        _ensure_context(self.module.device_index)
        if smem > self._max_dynamic_smem:
            self.set_max_dynamic_smem(smem)
        values, _, ptrs_addr = self._arg_buffers()
        for slot, kind, a in zip(values, self.signature, args):
            if kind == "p":
                slot.value = 0 if a is None else (a if isinstance(a, int) else a.data_ptr())
            elif kind == "m":
                slot[:] = a
            else:
                slot.value = a
        if stream is None:  # the raw handle: a Stream object costs microseconds a launch
            stream = _current_raw_stream(self.module.device_index)
        launch = gil_launcher()
        if launch is not None:  # the GIL held (see launch.py)
            err = launch.launch(self.function_ptr, gx, gy, gz, bx, by, bz, smem, stream,
                                ptrs_addr, pdl)
        elif pdl:
            driver = _driver()
            (err,) = driver.cuLaunchKernelEx(_pdl_config(driver, gx, gy, gz, bx, by, bz, smem, stream),
                                             self.function, ptrs_addr, 0)
        else:
            (err,) = _driver().cuLaunchKernel(self.function, gx, gy, gz, bx, by, bz, smem,
                                              stream, ptrs_addr, 0)
        if err:
            _check(_driver().CUresult(err), f"cuLaunchKernel{'Ex' if pdl else ''}({self.name}, "
                   f"grid={grid}, block={block}, smem={smem}{', PDL' if pdl else ''})")


def _current_raw_stream(device_index: int) -> int:
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _pdl_config(driver, gx, gy, gz, bx, by, bz, smem, stream):
    """A CUlaunchConfig with the programmatic stream serialization attribute."""
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = gx, gy, gz
    config.blockDimX, config.blockDimY, config.blockDimZ = bx, by, bz
    config.sharedMemBytes = smem
    config.hStream = driver.CUstream(stream)
    config.attrs = [attr]
    config.numAttrs = 1
    return config


class Module:
    """A compiled kernel file loaded on one device."""

    def __init__(self, file: str, defines: dict, device_index: int, arch: str, cubin: bytes,
                 extra_options: tuple = ()):
        self.file = file
        self.defines = dict(defines)
        self.device_index = device_index
        self.arch = arch
        self.extra_options = extra_options
        _ensure_context(device_index)
        driver = _driver()
        self._cubin = cubin  # kept alive while the module exists
        self.handle = _check(driver.cuModuleLoadData(cubin), f"cuModuleLoadData({file})")
        self._kernels: dict[str, Kernel] = {}

    def kernel(self, name: str, signature: str) -> Kernel:
        k = self._kernels.get(name)
        if k is None:
            fn = _check(_driver().cuModuleGetFunction(self.handle, name.encode()),
                        f"cuModuleGetFunction({self.file}: {name})")
            k = self._kernels[name] = Kernel(self, name, fn, signature)
        return k


_modules: dict[tuple, Module] = {}
_modules_lock = threading.Lock()
_arch_by_device: dict[int, str] = {}


def device_arch(device_index: int) -> str:
    arch = _arch_by_device.get(device_index)
    if arch is None:
        import torch

        arch = _arch_by_device[device_index] = arch_for(torch.cuda.get_device_capability(device_index))
    return arch


def load_module(file: str, device_index: int, defines: dict | None = None,
                extra_options: tuple = ()) -> Module:
    """The module of ``file`` built with ``defines`` for the device, compiled (or taken from the
    disk cache) and loaded on first use, then reused for the life of the process."""
    defines = defines or {}
    key = (file, tuple(sorted(defines.items())), extra_options, device_index)
    module = _modules.get(key)
    if module is None:
        with _modules_lock:
            module = _modules.get(key)
            if module is None:
                arch = device_arch(device_index)
                cubin = compile_cubin(file, arch, defines, extra_options)
                module = _modules[key] = Module(file, defines, device_index, arch, cubin,
                                                extra_options)
    return module


def loaded_modules() -> list[Module]:
    return list(_modules.values())
