"""``tileinfer quantize --fp8``: a GPTQ-rounded FP8 checkpoint of an imported model, which
``tileinfer run --fp8`` then answers from, and its clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cli_helpers import assert_one_line_error, tileinfer


def test_quantize_writes_a_checkpoint_that_runs_in_fp8(tiny_home, tmp_path):
    text = tmp_path / "calibration.txt"
    text.write_text("In the beginning the model read some text, and the text was good. " * 40)
    out = tmp_path / "tiny-fp8"
    done = tileinfer("quantize", "-m", "tiny", "--fp8", "--calibration", str(text), str(out),
                     env=tiny_home)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] \
        == "channel"
    from tileinfer import load_model

    model = load_model(out, dtype=torch.float32, quantize="fp8")
    assert model.weights.layers[0].down.q.dtype == torch.float8_e4m3fn
    answer = tileinfer("run", "-m", str(out), "--fp8", "-n", "3", "--json", "hi", env=tiny_home)
    assert answer.returncode == 0, answer.stderr
    assert len(json.loads(answer.stdout)["tokens"]) == 3
    # its config quantizes the activations: without an option it runs so (W8A8)
    plain = tileinfer("run", "-m", str(out), "-n", "3", "--json", "hi", env=tiny_home)
    assert plain.returncode == 0, plain.stderr
    assert "running them as stored (--fp8;" in plain.stderr
    assert json.loads(plain.stdout)["tokens"] == json.loads(answer.stdout)["tokens"]


def test_quantize_refuses_a_missing_text_and_an_existing_folder(tiny_home, tmp_path):
    assert_one_line_error(
        tileinfer("quantize", "-m", "tiny", "--fp8", "--calibration", str(tmp_path / "none.txt"),
                  str(tmp_path / "out"), env=tiny_home),
        r"^tileinfer: error: cannot read the calibration text .*none\.txt")
    (tmp_path / "taken").mkdir()
    text = tmp_path / "t.txt"
    text.write_text("some text")
    assert_one_line_error(
        tileinfer("quantize", "-m", "tiny", "--fp8", "--calibration", str(text),
                  str(tmp_path / "taken"), env=tiny_home),
        r"^tileinfer: error: .*taken exists; give a new folder$")
    # A folder inside a file: refused before the calibration runs, and nothing written.
    assert_one_line_error(
        tileinfer("quantize", "-m", "tiny", "--fp8", "--calibration", str(text),
                  str(text / "out"), env=tiny_home),
        r"^tileinfer: error: cannot write .*t\.txt/out: .*t\.txt is not a folder$")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "t.txt", "taken"]


def test_a_failed_write_leaves_no_folder(tiny_home, tmp_path, monkeypatch):
    """A write that fails part way (a disk filling up) leaves neither OUT nor its staging."""
    import argparse
    import errno
    import io

    import safetensors.torch

    from tileinfer_cli import quantize_cmd
    from tileinfer_cli.errors import UserError

    def fill_the_disk(tensors, path, *args, **kwargs):
        Path(path).write_bytes(b"part of it")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setenv("TILEINFER_HOME", tiny_home["TILEINFER_HOME"])
    monkeypatch.setattr(safetensors.torch, "save_file", fill_the_disk)
    text = tmp_path / "t.txt"
    text.write_text("some text to round the weights for " * 10)
    out = tmp_path / "place" / "out"
    out.parent.mkdir()
    args = argparse.Namespace(out=str(out), model="tiny", fp8=True, fp8_weight_only=False,
                              calibration=str(text), tokens=64, backend="ref")
    with pytest.raises(UserError, match=r"writing .*out failed: No space left on device"):
        quantize_cmd.run(args, io.StringIO())
    assert list(out.parent.iterdir()) == []


def test_quantize_fp8_weight_only_writes_a_checkpoint_without_activation_scales(tiny_home,
                                                                               tmp_path):
    text = tmp_path / "calibration.txt"
    text.write_text("The weights are rounded and the activations stay as they are. " * 40)
    out = tmp_path / "tiny-fp8-wo"
    done = tileinfer("quantize", "-m", "tiny", "--fp8-weight-only", "--calibration", str(text),
                     str(out), env=tiny_home)
    assert done.returncode == 0, done.stderr
    group = json.loads((out / "config.json").read_text())["quantization_config"][
        "config_groups"]["group_0"]
    assert group["input_activations"] is None and group["weights"]["type"] == "float"
    answer = tileinfer("run", "-m", str(out), "--fp8-weight-only", "-n", "3", "--json", "hi",
                       env=tiny_home)
    assert answer.returncode == 0, answer.stderr
    assert len(json.loads(answer.stdout)["tokens"]) == 3
    assert "stores FP8 weights" not in answer.stderr
    # without an option the weights run as stored, as the config asks, and the user is told
    plain = tileinfer("run", "-m", str(out), "-n", "3", "--json", "hi", env=tiny_home)
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["tokens"] == json.loads(answer.stdout)["tokens"]
    assert (f"{out.name} stores FP8 weights: running them as stored (--fp8-weight-only; "
            "--quantization none loads them dequantized)") in plain.stderr
    dequantized = tileinfer("run", "-m", str(out), "--quantization", "none", "-n", "3", "hi",
                            env=tiny_home)
    assert dequantized.returncode == 0, dequantized.stderr
    assert "stores FP8 weights" not in dequantized.stderr
