"""cuda_start: the driver calls the background thread makes, and when it makes none."""

from __future__ import annotations

import pytest

from tileinfer_cli import cuda_start


class NotStarted:
    """A thread that records its target when started (the test runs it itself)."""

    def __init__(self, target, started):
        self.target, self.started = target, started

    def start(self):
        self.started.append(self.target)


class FakeDriver:
    def __init__(self, init_result=0):
        self.calls, self.init_result = [], init_result

    def cuInit(self, flags):
        self.calls.append(("cuInit", flags))
        return self.init_result

    def cuDeviceGet(self, device, ordinal):
        self.calls.append(("cuDeviceGet", ordinal))
        return 0

    def cuDevicePrimaryCtxRetain(self, context, device):
        self.calls.append(("cuDevicePrimaryCtxRetain",))
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
