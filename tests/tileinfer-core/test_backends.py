"""The backend registry: discovery, fallbacks, clear errors."""

import pytest

from tileinfer.backend.hookspecs import hookimpl
from tileinfer.backend.registry import (BackendError, BackendInfo, Registry, get_backend,
                                        list_backends)


def test_installed_backends_are_listed_with_status():
    names = {b.name: b for b in list_backends()}
    assert {"ref", "triton", "cuda"} <= set(names)
    assert names["ref"].available
    for b in names.values():
        assert b.available or b.reason  # an unavailable backend always says why


def test_ref_implements_every_op():
    table = get_backend("ref")
    assert table.fallbacks == ()


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(BackendError, match="unknown backend 'nope'.*installed backends: .*ref"):
        get_backend("nope")


class _PartialBackend:
    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="partial", available=True, devices=("cpu",))

    @hookimpl
    def embed(self, out, table, ids):
        out.copy_(table[ids.long()])


def test_missing_ops_fall_back_to_ref_and_are_reported():
    reg = Registry()
    reg.register(_PartialBackend())
    table = reg.get("partial")
    assert "embed" not in table.fallbacks and "linear" in table.fallbacks
    assert table.linear is reg.get("ref").linear


class _Unavailable:
    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="needs-gpu", available=False, reason="no CUDA GPU")


def test_backend_that_cannot_run_here_says_why():
    reg = Registry()
    reg.register(_Unavailable())
    with pytest.raises(BackendError, match="cannot run here: no CUDA GPU"):
        reg.get("needs-gpu")


class _BadSignature:
    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="bad", available=True)

    @hookimpl
    def linear(self, out, x, w, bogus):  # argument names that are not in the spec
        pass


def test_plugin_with_wrong_argument_names_is_rejected_with_reason():
    reg = Registry()
    backend = reg.register(_BadSignature(), name="bad")
    assert not backend.available and "invalid plugin" in backend.reason
    with pytest.raises(BackendError, match="cannot run here: invalid plugin"):
        reg.get("bad")


def test_allow_list_env_restricts_loaded_plugins(monkeypatch):
    monkeypatch.setenv("TILEINFER_BACKENDS", "triton")
    reg = Registry()
    reg.load_entry_points()
    assert set(reg.backends) == {"ref", "triton"}
    with pytest.raises(BackendError, match="TILEINFER_BACKENDS is set"):
        reg.get("cuda")


def test_plugin_that_fails_to_import_is_reported(monkeypatch):
    import importlib.metadata as md

    broken = md.EntryPoint(name="broken", value="tileinfer_no_such_module", group="tileinfer")
    real = md.entry_points

    def fake_entry_points(group=None, **kw):
        eps = list(real(group=group, **kw))
        return eps + [broken] if group == "tileinfer" else eps

    monkeypatch.setattr(md, "entry_points", fake_entry_points)
    reg = Registry()
    reg.load_entry_points()
    assert "failed to import" in reg.backends["broken"].reason
    assert reg.get("ref")  # the others still load
    with pytest.raises(BackendError, match="failed to import"):
        reg.get("broken")
