"""Running the ``tileinfer`` command as a user does (a subprocess), and a tiny imported model for
CLI tests that need a model but not a good one."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def tileinfer(*args, stdin: bytes | str | None = None, env=None, timeout=300, cwd=None):
    """Run the command; stdout and stderr as text (undecodable bytes replaced)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    if "TILEINFER_BACKENDS" not in (env or {}):
        full_env.pop("TILEINFER_BACKENDS", None)
    if isinstance(stdin, str):
        stdin = stdin.encode()
    result = subprocess.run([sys.executable, "-m", "tileinfer_cli", *args],
                            input=stdin if stdin is not None else b"",
                            capture_output=True, timeout=timeout, env=full_env, cwd=cwd)
    result.stdout = result.stdout.decode("utf-8", "replace")
    result.stderr = result.stderr.decode("utf-8", "replace")
    return result


def assert_one_line_error(result, pattern, code=2):
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.search(pattern, lines[0]), result.stderr


def gguf_helpers():
    """tiny_llama and write_gguf of the GGUF import tests (a small GGUF with a tokenizer)."""
    spec = importlib.util.spec_from_file_location(
        "gguf_import_tests", TESTS / "tileinfer-core" / "io" / "test_gguf_import.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
