"""``tileinfer serve --no-engine-process``: the engine steps on a thread of the server's process
(no child process) and answers as the offline engine does; the default server runs it in a
child process (``test_serve_api.py``'s server, checked here too)."""

from __future__ import annotations

from pathlib import Path

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module)

from tileinfer import SamplingParams

from serve_fixtures import client, offline  # noqa: F401 (fixtures)
from test_serve_api import offline_texts
from test_serve_helpers import ServerProcess, tiny_folder


def child_pids(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture(scope="module")
def folder(smollm2_dir, tmp_path_factory):
    return tiny_folder(smollm2_dir, tmp_path_factory.mktemp("serve-thread"))


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-thread-log") / "server.log"
    s = ServerProcess(["-m", folder, "--load-format", "dummy", "--kv-tokens", "4096",
                       "--no-engine-process"], log)
    try:
        yield s.wait_ready()
    finally:
        rc = s.stop()
    assert rc == 0, s.output()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc")
def test_the_engine_runs_in_the_servers_process_and_answers_as_offline(server, client, offline):
    assert child_pids(server.proc.pid) == []
    answer = client.completions.create(model="tiny-smollm2-shape", prompt="Once upon a time",
                                       max_tokens=10, temperature=0.9, seed=4)
    ids = offline[1].encode("Once upon a time", add_special_tokens=True)
    assert answer.choices[0].text == offline_texts(offline, [ids], SamplingParams(0.9), 10,
                                                   [4])[0]
