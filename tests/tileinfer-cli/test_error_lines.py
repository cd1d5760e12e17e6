"""Failures that used to end in a traceback are one line: TileInfer's home that is a file, an
import into a full or read-only disk (refused before converting anything), standard output that
its reader closed, and a backend plugin whose op raises (exit code 1, naming plugin and op)."""

import errno
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from cli_helpers import assert_one_line_error, tileinfer
from tileinfer_cli.main import main


def test_home_that_is_a_file_is_one_line(tmp_path, tiny_gguf_file):
    # Before: NotADirectoryError with a traceback.
    home = tmp_path / "home"
    home.write_text("not a folder")
    for args in (["list"], ["run", "hi"], ["import", str(tiny_gguf_file)]):
        assert_one_line_error(tileinfer(*args, env={"TILEINFER_HOME": str(home)}),
                              f"TILEINFER_HOME={home} is a file, not a folder")
    assert home.read_text() == "not a folder"


def test_models_home_that_is_a_file_is_one_line(tmp_path, tiny_gguf_file):
    (tmp_path / "models").write_text("x")
    assert_one_line_error(tileinfer("import", str(tiny_gguf_file),
                                    env={"TILEINFER_HOME": str(tmp_path)}),
                          "models is a file, not a folder")


@pytest.fixture
def converting_fails(monkeypatch):
    """Converting tensors raises: a check that comes later than it would be too late."""
    import tileinfer.io.gguf_import as g

    def never(*args, **kwargs):
        raise AssertionError("the conversion started")

    monkeypatch.setattr(g, "read_weights", never)


def run_main(capsys, *args):
    code = main(list(args))
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_full_disk_is_refused_before_converting(tmp_path, monkeypatch, capsys, tiny_gguf_file,
                                                converting_fails):
    import shutil

    real = shutil.disk_usage
    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=3_000_000))
    code, err = run_main(capsys, "import", str(tiny_gguf_file))
    assert code == 2 and len(err) == 1, err
    assert "importing tiny.gguf needs about 17 MB in" in err[0]
    assert "but only 3 MB is free" in err[0]
    assert os.listdir(tmp_path / "models") == []


def test_full_disk_at_the_default_models_first_import(tmp_path, monkeypatch, capsys,
                                                      converting_fails):
    import shutil

    from tileinfer.io.default_model import DefaultModelUnavailable, default_gguf_path

    try:
        default_gguf_path()
    except DefaultModelUnavailable as e:
        pytest.skip(str(e))
    real = shutil.disk_usage
    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path))
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=10_000_000))
    monkeypatch.setattr("sys.stdin", open(os.devnull))
    code, err = run_main(capsys, "run", "hi")
    assert code == 2 and len(err) == 1, err
    assert "importing SmolLM2-135M-Instruct.Q4_1.gguf needs about" in err[0]


def test_read_only_models_home_is_refused_before_converting(tmp_path, monkeypatch, capsys,
                                                            tiny_gguf_file, converting_fails):
    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path))
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    code, err = run_main(capsys, "import", str(tiny_gguf_file))
    assert code == 2 and len(err) == 1, err
    assert f"cannot write into {tmp_path / 'models'} (Read-only file system)" in err[0]


def test_disk_filling_up_while_writing_keeps_the_previous_import(tmp_path, monkeypatch, capsys,
                                                                 tiny_gguf_file):
    import tileinfer.io.gguf_import as g

    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path))
    folder = g.import_gguf(tiny_gguf_file, name="tiny")
    before = {f.name: f.read_bytes() for f in folder.iterdir()}

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(g, "save_file", full)
    code, err = run_main(capsys, "import", str(tiny_gguf_file), "--force")
    assert code == 2 and len(err) == 1, err
    assert "No space left on device" in err[0] and "the import did not complete" in err[0]
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before
    assert os.listdir(tmp_path / "models") == ["tiny"]


def test_closed_standard_output_ends_quietly(tiny_home):
    # Before: `tileinfer run ... | head -n 1` printed a BrokenPipeError traceback.
    env = {**os.environ, **tiny_home, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen([sys.executable, "-m", "tileinfer_cli", "run", "-m", "tiny", "-n",
                              "50", "the thin"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    child.stdout.close()  # the reader is gone before the first word
    _, err = child.communicate(timeout=120)
    assert err.decode() == ""
    assert child.returncode == 128 + signal.SIGPIPE


def installed_plugin(folder, name: str, source: str, tiny_home) -> dict:
    """Install module ``name`` (``source``) in ``folder`` as a backend distribution with an entry
    point, the way pip would lay it out; returns the environment that finds it."""
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    info = folder / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tileinfer]\n{name} = {name}\n")
    return {**tiny_home, "PYTHONPATH": os.pathsep.join([str(folder),
                                                        os.environ.get("PYTHONPATH", "")])}


BROKEN_PLUGIN = """
    from tileinfer.backend import BackendInfo, hookimpl

    @hookimpl
    def tileinfer_backend_info():
        return BackendInfo(name="brokenb", available=True, devices=("cpu", "cuda"),
                           graph_safe=False)

    @hookimpl
    def rmsnorm(out, x, weight, eps):
        raise {exc}("the kernel fell over")
"""


@pytest.mark.parametrize("exc", ["RuntimeError", "ValueError"])
def test_plugin_op_that_raises_is_one_line_naming_plugin_and_op(tmp_path, tiny_home, exc):
    # Before: 32 lines of traceback; a ValueError would have passed for the user's mistake.
    env = installed_plugin(tmp_path, "brokenb", BROKEN_PLUGIN.format(exc=exc), tiny_home)
    result = tileinfer("run", "-m", "tiny", "--backend", "brokenb", "-n", "3", "hi", env=env)
    assert_one_line_error(result, f"backend 'brokenb' failed in op 'rmsnorm': {exc}: the kernel "
                                  "fell over", code=1)
    debug = tileinfer("run", "-m", "tiny", "--backend", "brokenb", "-n", "3", "hi",
                      env={**env, "TILEINFER_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr


NAN_PLUGIN = """
    import torch
    from tileinfer.backend import BackendInfo, get_backend, hookimpl

    @hookimpl
    def tileinfer_backend_info():
        return BackendInfo(name="nanb", available=True, devices=("cpu", "cuda"),
                           graph_safe=False)

    @hookimpl
    def add_rmsnorm(residual, out, delta, weight, eps):
        get_backend("ref").add_rmsnorm(residual, out, delta, weight, eps)
        out[-1, 0] = float("nan")  # as if an activation overflowed
"""


def test_non_finite_logits_end_the_answer_with_one_line(tmp_path, tiny_home):
    # Before: NaN logits printed one token again and again with exit 0.
    env = installed_plugin(tmp_path, "nanb", NAN_PLUGIN, tiny_home)
    result = tileinfer("run", "-m", "tiny", "--backend", "nanb", "-n", "3", "hi", env=env)
    assert_one_line_error(result, re.escape("the model computed non-finite logits (NaN or "
                                            "infinity) for generated token 0 on backend 'nanb'"))
