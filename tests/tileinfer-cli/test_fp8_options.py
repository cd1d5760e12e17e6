"""The FP8 options of the CLI: --fp8, --fp8-weight-only, --quantization (serve's name too), one
at a time, and tileinfer bench reporting FP8 weights."""

from __future__ import annotations

import argparse
import re

import pytest
import torch

from tiny_models import tiny  # noqa: F401


def test_cli_options_ask_for_fp8(tiny, capsys):
    from tileinfer_cli.main import main
    from tileinfer_cli.options import add_model_options, quantize_of

    p = argparse.ArgumentParser()
    add_model_options(p)
    for argv, want in (([], None), (["--int8"], "int8"), (["--fp8"], "fp8"),
                       (["--quantization", "fp8"], "fp8"), (["--quantization", "int8"], "int8"),
                       (["--fp8-weight-only"], "fp8-weight-only"),
                       (["--quantization", "fp8-weight-only"], "fp8-weight-only")):
        assert quantize_of(p.parse_args(argv)) == want, argv
    for both in (["--int8", "--fp8"], ["--fp8", "--fp8-weight-only"]):
        with pytest.raises(SystemExit):  # one of them at a time
            p.parse_args(both)
    capsys.readouterr()
    directory = tiny.directory("llama", False, torch.bfloat16)
    assert main(["bench", "--model", str(directory), "--backend", "ref", "--fp8",
                 "--prompt-len", "4", "--new-tokens", "3", "--repeats", "1", "--graphs", "off",
                 "--pipeline", "off"]) == 0
    assert re.search(r"weights [\d.]+ [kMG]?B \(fp8; ", capsys.readouterr().out)
    assert main(["bench", "--model", str(directory), "--backend", "ref", "--fp8-weight-only",
                 "--prompt-len", "4", "--new-tokens", "3", "--repeats", "1", "--graphs", "off",
                 "--pipeline", "off"]) == 0
    assert re.search(r"weights [\d.]+ [kMG]?B \(fp8-weight-only; ", capsys.readouterr().out)
