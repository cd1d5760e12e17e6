"""``tileinfer import``: an existing import is kept unless --force, the weights file gets the
mode the umask gives (0644 under 022, as the JSON files beside it), and integer tensors that the
import casts to floats are warned about."""

import json
import os
import warnings

import numpy as np
import pytest

from cli_helpers import assert_one_line_error, gguf_helpers, tileinfer


def test_import_again_keeps_the_model_unless_forced(tmp_path, tiny_gguf_file):
    # Before: the second import converted again without a word.
    env = {"TILEINFER_HOME": str(tmp_path)}
    first = tileinfer("import", str(tiny_gguf_file), env=env)
    assert first.returncode == 0, first.stderr
    weights = tmp_path / "models" / "tiny" / "model.safetensors"
    before = os.stat(weights)
    again = tileinfer("import", str(tiny_gguf_file), env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"tiny is already imported from {tiny_gguf_file}")
    assert "--force converts it again" in again.stdout
    assert os.stat(weights).st_ino == before.st_ino  # not written again
    forced = tileinfer("import", str(tiny_gguf_file), "--force", env=env)
    assert forced.returncode == 0 and "imported" in forced.stdout, forced.stderr
    assert os.stat(weights).st_ino != before.st_ino
    other = tmp_path / "elsewhere" / "tiny.gguf"
    other.parent.mkdir()
    other.write_bytes(tiny_gguf_file.read_bytes() + b"\0" * 64)  # another file of that name
    kept = os.stat(weights).st_ino
    assert_one_line_error(tileinfer("import", str(other), env=env),
                          f"a model named tiny exists already \\(from {tiny_gguf_file}\\): "
                          "--name NAME imports under another name, --force replaces it")
    assert os.stat(weights).st_ino == kept


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_weights_file_mode_follows_the_umask(tmp_path, tiny_gguf_file, umask, mode):
    # Before: model.safetensors was 0600 whatever the umask (safetensors' own temporary file).
    from tileinfer.io.gguf_import import import_gguf

    old = os.umask(umask)
    try:
        folder = import_gguf(tiny_gguf_file, tmp_path / "m")
    finally:
        os.umask(old)
    assert os.stat(folder / "model.safetensors").st_mode & 0o777 == mode
    assert os.stat(folder / "config.json").st_mode & 0o777 == mode


def test_integer_tensor_cast_is_warned(tmp_path, monkeypatch, capsys):
    # gguf 0.19's dequantize refuses I32 (the import then fails in one line, tested in
    # tileinfer-core); a reader that hands integer tensors over would have them cast silently.
    import gguf

    import tileinfer.io.gguf_import as g
    import tileinfer.io.gguf_tensors as tensors
    from tileinfer_cli.main import main

    real = tensors.dequantize

    def integers_as_they_are(data, qtype):
        return data if qtype == gguf.GGMLQuantizationType.I32 else real(data, qtype)

    monkeypatch.setattr(tensors, "dequantize", integers_as_they_are)
    helpers = gguf_helpers()
    model = helpers.tiny_llama()
    path = helpers.write_gguf(tmp_path / "ints.gguf", model, override={
        "output_norm.weight": np.ones(model.config.hidden_size, dtype=np.int32)})
    with pytest.warns(g.GGUFImportWarning, match="tensor output_norm.weight holds int32 "
                                                 "integers, not weights of a float or quantized "
                                                 "type; cast to bfloat16"):
        g.import_gguf(path, tmp_path / "out")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float tensors: no warning
        g.import_gguf(helpers.write_gguf(tmp_path / "floats.gguf", model), tmp_path / "out2")
    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path / "home"))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["import", str(path)]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "tileinfer: warning: ints.gguf: tensor output_norm.weight holds int32 integers, not "
        "weights of a float or quantized type; cast to bfloat16"]


def test_pull_of_a_gguf_tag_imports_the_downloaded_file(tmp_path, tiny_gguf_file, monkeypatch,
                                                           capsys):
    """``tileinfer pull OWNER/NAME:TAG``: the repo and the tag go to ``pull_gguf`` (which
    tests/tileinfer-core/io/test_hub.py checks against a fake hub; here it hands back a file as
    the hub cache would hold it), the file is imported under its name, and the line says how
    to run it; a second pull imports nothing again."""
    from tileinfer.io import hub
    from tileinfer_cli.main import main

    cached = tmp_path / "hub" / "snapshots" / ("3" * 40) / "tiny-Q8_0.gguf"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(tiny_gguf_file.read_bytes())
    asked = []

    def fake_pull_gguf(repo_id, tag, revision="main", token=None, progress=True):
        asked.append((repo_id, tag, revision))
        return cached

    monkeypatch.setattr(hub, "pull_gguf", fake_pull_gguf)
    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path / "home"))
    assert main(["pull", "acme/tiny-GGUF:Q8_0"]) == 0
    out = capsys.readouterr().out
    assert asked == [("acme/tiny-GGUF", "Q8_0", "main")]
    assert out == ("pulled tiny-Q8_0.gguf of acme/tiny-GGUF (main) and imported it as tiny-Q8_0: "
                   "tileinfer run -m tiny-Q8_0\n")
    weights = tmp_path / "home" / "models" / "tiny-Q8_0" / "model.safetensors"
    before = os.stat(weights).st_ino
    assert main(["pull", "acme/tiny-GGUF:Q8_0", "--revision", "v2"]) == 0
    assert asked[-1] == ("acme/tiny-GGUF", "Q8_0", "v2")
    assert os.stat(weights).st_ino == before  # the same file: not imported again
    # A newer snapshot's file (another path) replaces the import, as pulling again should.
    newer = tmp_path / "hub" / "snapshots" / ("4" * 40) / "tiny-Q8_0.gguf"
    newer.parent.mkdir(parents=True)
    newer.write_bytes(tiny_gguf_file.read_bytes())
    cached = newer
    assert main(["pull", "acme/tiny-GGUF:Q8_0"]) == 0
    assert os.stat(weights).st_ino != before
    record = json.loads((weights.parent / "import.json").read_text())
    assert record["source"] == str(newer.resolve())


def test_rm_of_a_gguf_tag_removes_its_import(tmp_path, tiny_gguf_file, monkeypatch, capsys):
    """``tileinfer rm OWNER/NAME:TAG`` finds the pulled file in the hub cache (as
    ``-m OWNER/NAME:TAG`` does) and removes the model imported from it; the download stays.
    Not pulled: one line saying so."""
    from huggingface_hub import constants

    from tileinfer.io import resolve_model_dir
    from tileinfer_cli.main import main

    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("TILEINFER_HOME", str(tmp_path / "home"))
    cached = cache / "models--acme--tiny-GGUF" / "snapshots" / ("3" * 40) / "tiny-Q8_0.gguf"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(tiny_gguf_file.read_bytes())
    folder = resolve_model_dir("acme/tiny-GGUF:q8_0")
    assert folder == tmp_path / "home" / "models" / "tiny-Q8_0"
    assert main(["rm", "acme/tiny-GGUF:Q8_0"]) == 0
    assert capsys.readouterr().out.startswith("removed tiny-Q8_0, the import of acme/tiny-GGUF:Q8_0")
    assert not folder.exists() and cached.is_file()
    assert main(["rm", "acme/tiny-GGUF:Q8_0"]) == 2
    assert "acme/tiny-GGUF:Q8_0 is not pulled here" in capsys.readouterr().err
