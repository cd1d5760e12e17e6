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


# --- plugins checked at load (issue 20) ----------------------------------------------------------

import importlib.metadata as md  # noqa: E402
import textwrap  # noqa: E402
import warnings  # noqa: E402

from tileinfer.backend.registry import BackendWarning  # noqa: E402


def install_fake_plugin(site, dist, module, source, entry_name=None, version="0.1"):
    """A plugin installed the way pip leaves it: a module and a dist-info with its entry point."""
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[tileinfer]\n{entry_name or module} = {module}\n")


PLUGIN_HEAD = """
from tileinfer.backend import BackendInfo, hookimpl
"""


def fresh_registry(monkeypatch, site):
    monkeypatch.syspath_prepend(str(site))
    reg = Registry()
    reg.load_entry_points()
    return reg


def _invalid(reg, name):
    matches = [b for b in reg.listed() if b.name == name and not b.available]
    assert matches, [b.name for b in reg.listed()]
    return matches[0]


class _Misspelled:
    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="typo", available=True, devices=("cpu",))

    @hookimpl
    def rms_norm(self, out, x, weight, eps):  # not an op: must not be silently ignored
        pass


def test_hookimpl_that_is_not_an_op_is_rejected_naming_plugin_and_op():
    reg = Registry()
    backend = reg.register(_Misspelled(), name="typo")
    assert not backend.available
    assert "'typo'" in backend.reason and "'rms_norm' is not an op" in backend.reason
    assert "did you mean 'rmsnorm'" in backend.reason
    with pytest.raises(BackendError, match="rms_norm"):
        reg.get("typo")


class _SwappedArgs:
    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="swapped", available=True, devices=("cpu",))

    @hookimpl
    def rmsnorm(self, out, weight, x, eps):  # the spec's names in another order
        out.copy_(x)


def test_hookimpl_with_arguments_in_another_order_is_rejected():
    # pluggy accepts it (same names); the op table calls ops positionally, so it would swap x
    # and weight silently.
    reg = Registry()
    backend = reg.register(_SwappedArgs(), name="swapped")
    assert not backend.available
    assert "op 'rmsnorm' takes (out, weight, x, eps); the spec is (out, x, weight, eps)" \
        in backend.reason


class _FewerArgs:
    @hookimpl
    def tileinfer_backend_info(self):
        return BackendInfo(name="fewer", available=True, devices=("cpu",))

    @hookimpl
    def linear(self, out, x, weight):
        pass


def test_hookimpl_with_missing_arguments_is_rejected():
    backend = Registry().register(_FewerArgs(), name="fewer")
    assert ("op 'linear' takes (out, x, weight); the spec is (out, x, weight, weight_scale, "
            "batch_invariant)") in backend.reason


@pytest.mark.parametrize("body,expected", [
    ("return None", "returned None, not a tileinfer.backend.BackendInfo"),
    ("raise RuntimeError('driver exploded')", "raised RuntimeError: driver exploded"),
    ("return BackendInfo(name='bad', available='yes')", "available is 'yes', not a bool"),
    ("return BackendInfo(name='bad', available=True, devices=())", "devices is ()"),
    ("return BackendInfo(name='bad', available=True, batch_invariant=1)",
     "batch_invariant is 1, not a bool"),
])
def test_bad_info_hook_marks_only_that_plugin_invalid(tmp_path, monkeypatch, body, expected):
    name = f"bad{abs(hash(body))}"  # a module name of its own per case (sys.modules caches)
    install_fake_plugin(tmp_path, "tileinfer-backend-bad", name, PLUGIN_HEAD + f"""
@hookimpl
def tileinfer_backend_info():
    {body.replace("'bad'", repr(name))}
""")
    reg = fresh_registry(monkeypatch, tmp_path)
    bad = reg.backends[name]
    assert not bad.available and expected in bad.reason and f"invalid plugin '{name}'" in bad.reason
    assert reg.get("ref").name == "ref"  # the others load
    assert {"ref", "triton", "cuda"} <= set(reg.backends)
    with pytest.raises(BackendError, match="cannot run here: invalid plugin"):
        reg.get(name)


def test_entry_point_whose_info_names_another_backend_is_rejected(tmp_path, monkeypatch):
    # Before: an entry point "evil" whose info said "ref" silently replaced the ref backend.
    install_fake_plugin(tmp_path, "evil-pkg", "evil", PLUGIN_HEAD + """
@hookimpl
def tileinfer_backend_info():
    return BackendInfo(name="ref", available=True, devices=("cpu",))

@hookimpl
def embed(out, table, ids):
    out.zero_()
""")
    reg = fresh_registry(monkeypatch, tmp_path)
    evil = _invalid(reg, "evil")
    assert "names backend 'ref', not 'evil'" in evil.reason
    ref = reg.get("ref")
    assert ref.backend.source.startswith("tileinfer-backend-ref")
    assert ref.embed.__module__ == "tileinfer_backend_ref"


def test_entry_point_that_collides_with_an_installed_backend_is_rejected(tmp_path, monkeypatch):
    install_fake_plugin(tmp_path, "shadow-pkg", "shadow_ref", PLUGIN_HEAD + """
@hookimpl
def tileinfer_backend_info():
    return BackendInfo(name="ref", available=True, devices=("cpu",))
""", entry_name="ref")
    reg = fresh_registry(monkeypatch, tmp_path)
    rejected = [b for b in reg.listed() if b.name == "ref" and not b.available]
    assert len(rejected) == 1 and "shadow-pkg" in rejected[0].source
    assert "claimed by several entry points" in rejected[0].reason
    assert reg.get("ref").backend.source.startswith("tileinfer-backend-ref")


def test_direct_registration_cannot_replace_an_installed_backend():
    class Impostor:
        @hookimpl
        def tileinfer_backend_info(self):
            return BackendInfo(name="ref", available=True, devices=("cpu",))

    reg = Registry()
    backend = reg.register(Impostor())
    assert not backend.available and "backend 'ref' is already installed" in backend.reason
    assert reg.get("ref").backend.plugin is not None
    assert reg.get("ref").backend.source.startswith("tileinfer-backend-ref")


def test_direct_re_registration_replaces_the_earlier_one():
    reg = Registry()
    first, second = _PartialBackend(), _PartialBackend()
    reg.register(first)
    reg.register(second)
    assert reg.get("partial").backend.plugin is second


def test_unknown_name_in_allow_list_is_reported(monkeypatch):
    monkeypatch.setenv("TILEINFER_BACKENDS", "nosuch,triton")
    reg = Registry()
    with pytest.warns(BackendWarning, match="TILEINFER_BACKENDS names backends that are not "
                      "installed: nosuch"):
        reg.load_entry_points()
    listed = {b.name: b for b in reg.listed()}
    assert "not installed (named in TILEINFER_BACKENDS)" in listed["nosuch"].reason
    assert set(reg.backends) == {"ref", "triton"}


def test_allow_list_of_installed_names_warns_nothing(monkeypatch):
    monkeypatch.setenv("TILEINFER_BACKENDS", "ref,cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Registry().load_entry_points()


def test_backend_without_a_present_device_is_a_clear_error_at_load():
    # BackendInfo's default devices are ("cuda",): on a CPU machine load_model said nothing and
    # died moving the weights to CUDA.
    import torch

    from tileinfer.model.loader import default_device

    class CudaOnly:
        @hookimpl
        def tileinfer_backend_info(self):
            return BackendInfo(name="cudaonly", available=True)

    reg = Registry()
    reg.register(CudaOnly())
    table = reg.get("cudaonly")
    if torch.cuda.is_available():
        assert default_device(table).type == "cuda"
    else:
        with pytest.raises(BackendError, match="runs on cuda .*none is present here"):
            default_device(table)


def test_entry_points_seen_twice_on_sys_path_are_one(monkeypatch):
    real = md.entry_points

    def doubled(group=None, **kw):
        eps = list(real(group=group, **kw))
        return eps + eps if group == "tileinfer" else eps

    monkeypatch.setattr(md, "entry_points", doubled)
    reg = Registry()
    reg.load_entry_points()
    assert reg.get("ref") and not reg.rejected


def test_choosing_an_own_backend_reads_no_other_distribution(monkeypatch):
    # A new process's start: get("ref") finds tileinfer-backend-ref by its name, without the
    # scan of every installed distribution's entry points.
    scans = []
    real = md.entry_points

    def counted(group=None, **kw):
        scans.append(group)
        return real(group=group, **kw)

    monkeypatch.setattr(md, "entry_points", counted)
    reg = Registry()
    table = reg.get("ref")
    assert table.backend.source.startswith("tileinfer-backend-ref")
    assert scans == []
    reg.listed()  # listing reads the group in full
    assert scans == ["tileinfer"]


def test_claimant_of_an_own_name_is_listed_after_a_fast_choice(tmp_path, monkeypatch):
    install_fake_plugin(tmp_path, "shadow-pkg", "shadow_ref", PLUGIN_HEAD + """
@hookimpl
def tileinfer_backend_info():
    return BackendInfo(name="ref", available=True, devices=("cpu",))
""", entry_name="ref")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry()
    assert reg.get("ref").backend.source.startswith("tileinfer-backend-ref")
    rejected = [b for b in reg.listed() if b.name == "ref" and not b.available]
    assert len(rejected) == 1 and "shadow-pkg" in rejected[0].source
    assert "claimed by several entry points" in rejected[0].reason
    assert reg.get("ref").backend.source.startswith("tileinfer-backend-ref")


def test_allow_list_still_refuses_an_own_backend_it_leaves_out(monkeypatch):
    monkeypatch.setenv("TILEINFER_BACKENDS", "ref")
    reg = Registry()
    with pytest.raises(BackendError, match="TILEINFER_BACKENDS is set"):
        reg.get("triton")
