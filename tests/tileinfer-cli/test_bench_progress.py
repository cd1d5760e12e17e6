"""``tileinfer bench`` says what it is doing as it goes (standard error), so that a run on the CPU
does not sit silent for minutes; the table and JSON stay alone on standard output."""

import json
import os
import subprocess
import sys
import time

from cli_helpers import tileinfer


def test_first_line_comes_before_the_weights_are_made():
    # Before: nothing for 90 s on the CPU. The default shape (1B parameters) takes long to
    # make on a CPU; its first line must not wait for that.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen([sys.executable, "-m", "tileinfer_cli", "bench", "--backend", "ref",
                              "--dtype", "fp32", "--threads", "1"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        start = time.monotonic()
        first = child.stderr.readline()
        waited = time.monotonic() - start
        assert child.poll() is None, "bench ended before the first line was read"
    finally:
        child.kill()
        child.communicate()
    assert first.startswith("bench: making random weights of llama3.2-1b (fp32) for backend ref")
    assert waited < 60


def test_each_run_is_reported_and_stdout_holds_the_results():
    result = tileinfer("bench", "--shape", "smollm2-135m", "--backend", "ref", "--dtype", "fp32",
                       "--prompt-len", "2", "--new-tokens", "3", "--repeats", "2",
                       "--threads", "1", env={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("bench: making random weights of smollm2-135m (fp32)")
    assert lines[1] == ("bench: measuring 2 prompt + 3 new tokens, graphs off, pipeline off: 2 "
                        "warm-ups and 2 runs")
    assert lines[2:4] == ["bench: warm-up 1/2 done", "bench: warm-up 2/2 done"]
    assert lines[4].startswith("bench: run 1/2: first token after ")
    assert lines[5].startswith("bench: run 2/2: ") and len(lines) == 6
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 1 and rows[0]["new_tokens"] == 3
    assert "bench:" not in result.stdout
