"""The kernels a process launched, preloaded by the next one (warm_start.py): what the hook
records, what is stored and in which order, what is preloaded and when it stops; on a GPU, a
second process's launches find every kernel of the first one's preloaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tileinfer_backend_triton import warm_start

PKG = "tileinfer_backend_triton"


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test with the module's own state empty."""
    monkeypatch.setattr(warm_start, "_seen", {})
    monkeypatch.setattr(warm_start, "_stored", [])
    monkeypatch.setattr(warm_start, "_preloaded", {})
    monkeypatch.setattr(warm_start, "_stop", warm_start.threading.Event())


def compiled(module, name, data, warmup=False):
    """What Triton passes its jit_post_compile_hook (the arguments this module reads)."""
    return dict(key="k", repr="r", fn=SimpleNamespace(module=module, name=name, jit_function=None),
                compile={"specialization_data": data}, is_manual_warmup=warmup,
                already_compiled=False)


def test_the_hook_records_this_packages_kernels_a_launch_found():
    warm_start.record(**compiled(f"{PKG}.kernels.norms", "_rmsnorm", "A"))
    warm_start.record(**compiled(f"{PKG}.kernels.norms", "_rmsnorm", "B", warmup=True))
    warm_start.record(**compiled("someone_else.kernels", "k", "C"))
    warm_start.record(**compiled(f"{PKG}.kernels.norms", "_rmsnorm", None))
    assert list(warm_start._seen) == [(f"{PKG}.kernels.norms", "_rmsnorm", "A")]


def test_the_hook_keeps_an_earlier_hook(monkeypatch):
    from triton import knobs

    calls = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook",
                        lambda **kw: calls.append(kw["compile"]["specialization_data"]))
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    warm_start.install_hook()
    knobs.runtime.jit_post_compile_hook(**compiled(f"{PKG}.kernels.embed", "_embed", "A"))
    assert calls == ["A"] and (f"{PKG}.kernels.embed", "_embed", "A") in warm_start._seen


def test_a_launch_that_must_find_its_kernel_stops_the_preloading_first(monkeypatch):
    from triton import knobs

    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: "earlier hook")
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    stops = []
    warm_start.install_hook(before_launch_compile=lambda: stops.append(1))
    assert knobs.runtime.jit_cache_hook(**compiled(f"{PKG}.kernels.embed", "_embed", "A",
                                                   warmup=True)) == "earlier hook"
    assert stops == []  # a preload (Triton calls it a manual warm-up) goes on
    assert knobs.runtime.jit_cache_hook(**compiled(f"{PKG}.kernels.embed", "_embed", "A")) \
        == "earlier hook"
    assert stops == [1]


def entry(i):
    return [f"{PKG}.kernels.linear", f"kernel{i}", f"data{i}"]


def test_the_store_keeps_new_then_launched_then_the_rest(tmp_path, monkeypatch):
    store = tmp_path / "home" / "triton-kernels.json"
    warm_start._stored[:] = [entry(i) for i in range(4)]
    # Preloaded 0..3; the process launched 2 (its handles loaded) and found 8 and 9 itself.
    for i in range(4):
        warm_start._preloaded[tuple(entry(i))] = SimpleNamespace(module=object() if i == 2
                                                                 else None)
    for i in (9, 8):
        warm_start._seen[tuple(entry(i))] = None
    warm_start.save(store, "fp")
    saved = json.loads(store.read_text())
    assert saved["fingerprint"] == "fp"
    assert saved["kernels"] == [entry(9), entry(8), entry(2), entry(0), entry(1), entry(3)]
    assert warm_start.read(store, "fp") == saved["kernels"]
    assert warm_start.read(store, "another fingerprint") == []
    monkeypatch.setattr(warm_start, "KEPT", 3)
    warm_start.save(store, "fp")
    assert json.loads(store.read_text())["kernels"] == [entry(9), entry(8), entry(2)]


def test_nothing_is_written_when_every_kernel_found_was_stored(tmp_path):
    store = tmp_path / "triton-kernels.json"
    warm_start._stored[:] = [entry(1)]
    warm_start._seen[tuple(entry(1))] = None
    warm_start.save(store, "fp")
    assert not store.exists()


def test_a_damaged_store_is_no_store(tmp_path):
    store = tmp_path / "triton-kernels.json"
    for text in ("not json", "[1, 2]", '{"fingerprint": "fp", "kernels": [[1, 2, 3], "x"]}'):
        store.write_text(text)
        assert warm_start.read(store, "fp") == []


class FakeKernel:
    def __init__(self, fails=False):
        self.fails, self.data = fails, []

    def preload(self, data):
        if self.fails:
            raise RuntimeError("another GPU")
        self.data.append(data)
        if data == "stop after me":
            warm_start.stop()
        return SimpleNamespace(module=None)


def test_preload_skips_what_it_cannot_make_and_stops_when_asked():
    good, bad = FakeKernel(), FakeKernel(fails=True)
    table = {"good": good, "bad": bad, "plain": object()}
    kernels = [["m", "good", "1"], ["m", "bad", "2"], ["m", "gone", "3"], ["m", "plain", "4"],
               ["m", "good", "stop after me"], ["m", "good", "never"]]
    made = warm_start.preload(kernels, find=lambda module, name: table.get(name))
    assert made == 2 and good.data == ["1", "stop after me"]
    assert set(warm_start._preloaded) == {("m", "good", "1"), ("m", "good", "stop after me")}


def test_resolve_finds_this_packages_functions_only():
    from tileinfer_backend_triton.kernels import norms

    name = next(n for n, v in vars(norms).items() if hasattr(v, "fn") and hasattr(v, "run"))
    assert warm_start.resolve(f"{PKG}.kernels.norms", name) is getattr(norms, name)
    assert warm_start.resolve(f"{PKG}.kernels.norms", "no_such_kernel") is None
    assert warm_start.resolve("os", "path") is None


def test_the_fingerprint_follows_the_sources(tmp_path):
    (tmp_path / "a.py").write_text("x = 1")
    first = warm_start.package_fingerprint(tmp_path, "triton sm9.0")
    assert warm_start.package_fingerprint(tmp_path, "triton sm8.0") != first
    (tmp_path / "a.py").write_text("x = 22")
    assert warm_start.package_fingerprint(tmp_path, "triton sm9.0") != first


PROCESS = """
import torch, tileinfer
from tileinfer.backend import get_backend
from tileinfer.model.random_weights import random_model
get_backend("triton")
import tileinfer_backend_triton
from tileinfer_backend_triton import warm_start
tileinfer_backend_triton._KEY_THREAD.join()  # every stored kernel preloaded (no stop)
from tileinfer.model.config import config_from_dict
config = config_from_dict(dict(model_type="llama", vocab_size=512, hidden_size=256,
    intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
model = random_model(config, dtype=torch.bfloat16, backend="triton", device="cuda", max_len=128)
tokens = tileinfer.generate(model, list(range(1, 40)), 8)
torch.cuda.synchronize()
print(len(warm_start._stored), len(warm_start._preloaded), len(warm_start._seen))
print(tokens)
"""


@pytest.mark.gpu
def test_a_second_process_finds_the_first_ones_kernels_preloaded(tmp_path):
    pytest.importorskip("triton")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = {**os.environ, "TILEINFER_HOME": str(tmp_path / "home")}
    runs = [subprocess.run([sys.executable, "-c", PROCESS], env=env, capture_output=True,
                           text=True, timeout=600) for _ in range(2)]
    off = {**env, "TILEINFER_TRITON_WARM_START": "0"}
    runs.append(subprocess.run([sys.executable, "-c", PROCESS], env=off, capture_output=True,
                               text=True, timeout=600))
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    counts = [list(map(int, run.stdout.splitlines()[0].split())) for run in runs]
    stored, preloaded, seen = counts[0]
    assert stored == 0 and preloaded == 0 and seen > 0  # the first process found them itself
    stored, preloaded, seen = counts[1]
    assert stored > 0 and preloaded == stored and seen == 0  # every launch found it preloaded
    assert counts[2] == [0, 0, 0]  # turned off: nothing read, preloaded or recorded
    tokens = [run.stdout.splitlines()[1] for run in runs]
    assert tokens[0] == tokens[1] == tokens[2]  # the preloaded kernels compute the same
