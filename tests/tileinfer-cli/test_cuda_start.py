"""cuda_start: the driver and cuBLAS calls the background thread makes, and when it makes none."""

from __future__ import annotations

from pathlib import Path

import pytest

from tileinfer_cli import cuda_start


class NotStarted:
    """A thread that records its target when started (the test runs it itself)."""

    def __init__(self, target, started):
        self.target, self.started = target, started

    def start(self):
        self.started.append(self.target)


class FakeDriver:
    def __init__(self, init_result=0, alloc_results=(0, 0, 0)):
        self.calls, self.init_result = [], init_result
        self.alloc_results = list(alloc_results)

    def cuInit(self, flags):
        self.calls.append(("cuInit", flags))
        return self.init_result

    def cuDeviceGet(self, device, ordinal):
        self.calls.append(("cuDeviceGet", ordinal))
        return 0

    def cuDevicePrimaryCtxRetain(self, context, device):
        self.calls.append(("cuDevicePrimaryCtxRetain",))
        return 0

    def cuCtxSetCurrent(self, context):
        self.calls.append(("cuCtxSetCurrent",))
        return 0

    def cuMemAlloc_v2(self, pointer, size):
        result = self.alloc_results.pop(0)
        if result == 0:
            pointer._obj.value = 4096 * (len(self.calls) + 1)
        self.calls.append(("cuMemAlloc_v2", size.value, result))
        return result

    def cuCtxSynchronize(self):
        self.calls.append(("cuCtxSynchronize",))
        return 0

    def cuMemFree_v2(self, pointer):
        self.calls.append(("cuMemFree_v2", pointer.value))
        return 0


class FakeCublas:
    def __init__(self, calls):
        self.calls = calls

    def cublasCreate_v2(self, handle):
        self.calls.append(("cublasCreate_v2",))
        return 0

    def cublasGemmEx(self, handle, op_a, op_b, m, n, k, alpha, a, a_type, lda, b, b_type, ldb,
                     beta, c, c_type, ldc, compute, algo):
        self.calls.append(("cublasGemmEx", (m, n, k, lda, ldb, ldc), (a_type, b_type, c_type),
                           (a.value, b.value, c.value)))
        return 0


@pytest.mark.parametrize("init_result,expected", [
    (0, ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"]),
    (100, ["cuInit"]),  # CUDA_ERROR_NO_DEVICE: nothing more
])
def test_the_thread_initializes_the_driver_then_retains_device_0s_primary_context(
        monkeypatch, init_result, expected):
    driver = FakeDriver(init_result)
    monkeypatch.setattr(cuda_start.ctypes, "CDLL", lambda name: driver)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("CUDA_MODULE_LOADING", raising=False)
    started = []
    monkeypatch.setattr(cuda_start.threading, "Thread", lambda target, **kw: NotStarted(target, started))
    cuda_start.start_cuda_in_background(None)
    assert len(started) == 1
    started[0]()
    assert [c[0] for c in driver.calls] == expected
    assert ("cuDeviceGet", 0) in driver.calls or init_result != 0
    assert cuda_start.os.environ["CUDA_MODULE_LOADING"] == "LAZY"


def test_no_thread_for_the_cpu_backend_or_triton_s_interpreter(monkeypatch):
    started = []
    monkeypatch.setattr(cuda_start.threading, "Thread", lambda target, **kw: NotStarted(target, started))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cuda_start.start_cuda_in_background("ref")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cuda_start.start_cuda_in_background("triton")
    assert started == []


def test_a_machine_without_a_driver_ends_the_thread_quietly(monkeypatch):
    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(cuda_start.ctypes, "CDLL", no_library)
    cuda_start._start_cuda()  # returns without raising


def test_for_the_cuda_backend_the_thread_runs_one_cublas_gemm_then_frees_its_buffers(monkeypatch):
    driver = FakeDriver()
    cublas = FakeCublas(driver.calls)
    monkeypatch.setattr(cuda_start.ctypes, "CDLL", lambda name: driver)
    monkeypatch.setattr(cuda_start, "cublas_library", lambda: cublas)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    started = []
    monkeypatch.setattr(cuda_start.threading, "Thread",
                        lambda target, args=(), **kw: NotStarted(lambda: target(*args), started))
    cuda_start.start_cuda_in_background("cuda")
    started[0]()
    names = [c[0] for c in driver.calls]
    assert names == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                     "cublasCreate_v2", "cuMemAlloc_v2", "cuMemAlloc_v2", "cuMemAlloc_v2",
                     "cublasGemmEx", "cuCtxSynchronize", "cuMemFree_v2", "cuMemFree_v2",
                     "cuMemFree_v2"]
    m, k, n = cuda_start.M, cuda_start.K, cuda_start.N
    assert [c[1] for c in driver.calls if c[0] == "cuMemAlloc_v2"] == [m * k * 2, k * n * 2,
                                                                       m * n * 2]
    gemm = next(c for c in driver.calls if c[0] == "cublasGemmEx")
    # column-major C^T = B^T A^T: (N, M, K) with leading dimensions N, K, N; all bf16
    assert gemm[1] == (n, m, k, n, k, n) and gemm[2] == (cuda_start.BF16,) * 3
    a, b, c = (c[1] for c in driver.calls if c[0] == "cuMemFree_v2")
    assert gemm[3] == (b, a, c)  # B first, then A, then C


def test_a_failed_allocation_frees_the_others_and_runs_no_gemm(monkeypatch):
    driver = FakeDriver(alloc_results=(0, 2, 0))  # CUDA_ERROR_OUT_OF_MEMORY on the second
    cuda_start.first_gemm(driver, FakeCublas(driver.calls))
    names = [c[0] for c in driver.calls]
    assert "cublasGemmEx" not in names and names.count("cuMemFree_v2") == 1


def test_other_backends_start_no_cublas(monkeypatch):
    driver = FakeDriver()
    monkeypatch.setattr(cuda_start.ctypes, "CDLL", lambda name: driver)
    monkeypatch.setattr(cuda_start, "cublas_library", lambda: pytest.fail("cuBLAS looked for"))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for backend in (None, "triton"):
        started = []
        monkeypatch.setattr(cuda_start.threading, "Thread",
                            lambda target, args=(), **kw: NotStarted(lambda: target(*args),
                                                                     started))
        cuda_start.start_cuda_in_background(backend)
        started[0]()
    assert "cuCtxSetCurrent" not in [c[0] for c in driver.calls]


def test_cublas_library_is_the_nvidia_wheel_s_beside_torch(monkeypatch, tmp_path):
    lib = tmp_path / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcublasLt.so.13").write_bytes(b"")
    (lib / "libcublas.so.13").write_bytes(b"")
    monkeypatch.setattr(cuda_start.ctypes, "CDLL", lambda path: path)
    monkeypatch.setattr(cuda_start, "torch_site", lambda: str(tmp_path))
    assert cuda_start.cublas_library() == str(lib / "libcublas.so.13")
    monkeypatch.setattr(cuda_start, "torch_site", lambda: str(tmp_path / "elsewhere"))
    assert cuda_start.cublas_library() is None
    monkeypatch.setattr(cuda_start, "torch_site", lambda: None)
    assert cuda_start.cublas_library() is None


def test_torch_site_is_the_folder_holding_torch_s_package():
    import torch

    assert cuda_start.torch_site() == str(Path(torch.__file__).parent.parent)
