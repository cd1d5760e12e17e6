"""``tileinfer serve`` start-up checks and shutdown, CORS and errors without the server's paths:
the tiny random-weight model of ``test_serve_api.py`` with no chat template, in a server of its
own that the last test stops with two SIGTERMs."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest

for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module)
httpx = pytest.importorskip("httpx")

from serve_fixtures import TIMEOUT
from test_serve_helpers import ServerProcess, tiny_folder, wait_for
from tileinfer_cli.serve.errors import redact

ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def folder(smollm2_dir, tmp_path_factory):
    folder = tiny_folder(smollm2_dir, tmp_path_factory.mktemp("serve-robustness"))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-robustness-log") / "server.log"
    # --kv-tokens less than one sequence of the model's 512 positions: the pool is raised.
    s = ServerProcess(["-m", folder, "--load-format", "dummy", "--kv-tokens", "256",
                       "--allowed-origins", ORIGIN, "--shutdown-grace", "60"], log)
    try:
        yield s.wait_ready()
    finally:
        s.stop()


def test_redact_cuts_paths_to_their_last_part():
    assert redact("/home/ann/models/Qwen3 has no chat template") == "Qwen3 has no chat template"
    assert redact("open('/tmp/x/config.json') failed: /a/b/") == \
        "open('config.json') failed: <path>"
    for kept in ("see http://127.0.0.1:8000/v1/models", "3 tokens/s", "a / b", "/health"):
        assert redact(kept) == kept


def test_a_pool_smaller_than_one_sequence_holds_one_with_a_note(server):
    """--kv-tokens 256 with --max-len 512: the model's pool always holds one whole sequence (a
    request that leaves max_tokens out may fill the context), and the start says so once."""
    notes = [line for line in server.output().splitlines() if "--kv-tokens 256" in line]
    assert len(notes) == 1 and "one --max-len 512 sequence" in notes[0], server.output()
    # 500 tokens on the CPU: seconds on a loaded machine (httpx's own timeout is 5 s)
    r = httpx.post(server.url + "/v1/completions",
                   json={"prompt": "hi", "max_tokens": 500, "stop": []}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text


def test_no_chat_template_is_a_400_without_the_folders_path(server, folder):
    r = httpx.post(server.url + "/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "no chat template" in message and str(folder.parent) not in message
    assert "/" not in message.replace("/v1/completions", "")
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                   timeout=TIMEOUT)
    assert r.status_code == 200, r.text


def test_cors_for_the_allowed_origins_only(server):
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(server.url + "/v1/completions", headers=preflight)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.options(server.url + "/v1/completions",
                      headers={**preflight, "Origin": "https://elsewhere.example"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers
    r = httpx.get(server.url + "/v1/models", headers={"Origin": ORIGIN})
    assert r.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.post(server.url + "/v1/completions", json={"prompt": []},
                   headers={"Origin": ORIGIN})  # an error carries them too
    assert r.status_code == 400 and r.headers["access-control-allow-origin"] == ORIGIN


def _not_accepting(url) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 503
    except httpx.HTTPError:
        return True


def test_a_second_sigterm_exits_at_once_with_an_error_code(server):
    # A request whose body is still coming keeps the graceful shutdown waiting (60 s of grace).
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    conn = socket.create_connection(("127.0.0.1", server.port))
    try:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:5])
        time.sleep(0.3)
        server.terminate()
        wait_for(lambda: _not_accepting(server.url), 30, "the graceful shutdown")
        time.sleep(0.5)
        assert server.proc.poll() is None  # still waiting for the request
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(10) == 128 + signal.SIGTERM
        assert time.monotonic() - started < 5
        assert "SIGTERM again: exiting now" in server.output()
    finally:
        conn.close()
