"""The ``tileinfer`` command, driven as a subprocess the way a user runs it (the embedded default
model on the ref backend, on the CPU)."""

import os
import subprocess
import sys

import pytest
import torch

CMD = [sys.executable, "-m", "tileinfer_cli"]


def tileinfer(*args, stdin=None, timeout=600):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(CMD + list(args), input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=env)


def assert_one_line_error(result, pattern):
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and pattern in lines[0], result.stderr


def test_backends_lists_every_backend_with_status():
    result = tileinfer("backends")
    assert result.returncode == 0, result.stderr
    for name in ("ref", "triton", "cuda"):
        assert any(line.startswith(name) for line in result.stdout.splitlines()), result.stdout
    assert "unavailable: no CUDA GPU" in result.stdout or "available" in result.stdout


@pytest.mark.slow
def test_run_answers_with_the_default_model():
    result = tileinfer("run", "What is the capital of France?", "-n", "12", "--backend", "ref")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


@pytest.mark.slow
def test_chat_over_stdin_reuses_the_cached_prefix():
    script = "What is the capital of France?\n/stats\nAnd of Italy?\n/stats\n/reset\n/exit\n"
    result = tileinfer("chat", "--backend", "ref", "-n", "10", stdin=script)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Paris" in out
    stats = [line for line in out.splitlines() if "reused" in line]
    assert len(stats) == 2
    first_reused = int(stats[0].split("reused ")[1].split()[0])
    second_reused = int(stats[1].split("reused ")[1].split()[0])
    assert first_reused == 0 and second_reused > 20  # the first turn's tokens stay cached
    assert "(conversation cleared)" in out


@pytest.mark.parametrize("args,pattern", [
    (("run", "hi", "--backend", "nope"), "unknown backend 'nope'"),
    pytest.param(("run", "hi", "--backend", "cuda"), "cannot run here",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="cuda runs here")),
    (("run", "hi", "--temperature", "-1"), "--temperature/-t: -1 is out of range"),
    (("run", "hi", "--top-p", "2"), "--top-p: 2 is out of range"),
    (("run", "/no/such/model", "hi"), "/no/such/model"),
    (("rm", "nobody/nothing"), "nobody/nothing"),
    (("import", "/no/such/file.gguf"), "/no/such/file.gguf"),
])
def test_user_mistakes_are_one_clear_line(args, pattern):
    assert_one_line_error(tileinfer(*args), pattern)
