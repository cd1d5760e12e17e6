"""``tileinfer serve`` on the embedded SmolLM2-135M-Instruct (real weights, the ref backend on
the CPU), with an API key and tight limits: one running request, one waiting, a 2 s queue
timeout, a 3 s shutdown grace. The model is slow enough on the CPU that a long answer is still
running while the tests disconnect, fill the queue and stop the server. The last test stops
the server (SIGTERM)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

# The server and its clients come with the serve extra (the test environment installs it; a bare
# GPU image lacks them): without them these tests skip.
for _module in ("starlette", "uvicorn", "pydantic", "prometheus_client"):
    pytest.importorskip(_module)
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from test_serve_helpers import ServerProcess, metrics, wait_for

KEY = "test-key-1f2e"
AUTH = {"Authorization": f"Bearer {KEY}"}
QUESTION = "What is the capital of France?"
LABEL = '{model_name="SmolLM2-135M-Instruct"}'
TIMEOUT = 120

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve-smollm2") / "server.log"
    s = ServerProcess(["-m", smollm2_dir, "--backend", "ref", "--kv-tokens", "8192",
                       "--max-running", "1", "--max-queue", "1", "--queue-timeout", "2",
                       "--shutdown-grace", "3"], log, env={"TILEINFER_API_KEY": KEY})
    try:
        yield s.wait_ready()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=AUTH) as c:
        yield c


def long_stream(http, max_tokens=400):
    """A streamed request that runs for many seconds; returns (response, its line iterator)
    once its first chunk arrived. Close the response to disconnect."""
    request = http.build_request("POST", "/v1/chat/completions", json=dict(
        messages=[{"role": "user", "content": "Write a long essay about rivers."}],
        max_tokens=max_tokens, ignore_eos=True, stream=True))
    response = http.send(request, stream=True)
    assert response.status_code == 200, response.read()
    lines = response.iter_lines()
    next(line for line in lines if line.startswith("data: "))
    return response, lines


def test_every_endpoint_but_health_needs_the_key(server):
    assert httpx.get(server.url + "/health").status_code == 200
    for path in ("/v1/models", "/metrics"):
        assert httpx.get(server.url + path).status_code == 401
        assert httpx.get(server.url + path, headers={"Authorization": "Bearer nope"}) \
            .status_code == 401
        assert httpx.get(server.url + path, headers=AUTH).status_code == 200
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": []})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert r.headers["www-authenticate"] == "Bearer"
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()


def test_paris_with_the_same_text_as_tileinfer_run(server, smollm2_dir):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=TIMEOUT,
                           max_retries=0)
    # Greedy, as tileinfer run decodes a model whose generation_config.json sets no sampling
    # (the server's default would be OpenAI's temperature 1).
    answer = client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": QUESTION}],
        max_tokens=12, temperature=0)
    text = answer.choices[0].message.content
    assert "Paris" in text
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=[{"role": "user", "content": QUESTION}],
        max_tokens=12, temperature=0, stream=True) if c.choices)
    assert streamed == text
    run = subprocess.run([sys.executable, "-m", "tileinfer_cli", "run", "-m", str(smollm2_dir),
                          "--backend", "ref", "-n", "12", "--threads", "1", "--json", QUESTION],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["text"] == text


def test_a_client_that_disconnects_frees_its_pages(server, http):
    before = metrics(server.url, AUTH)
    response, _ = long_stream(http)
    assert metrics(server.url, AUTH)["tileinfer_kv_pages_used"] > 0
    response.close()  # mid-stream: the request is aborted and its pages freed
    after = wait_for(lambda: (m := metrics(server.url, AUTH))["tileinfer_kv_pages_used"] == 0
                     and m["vllm:num_requests_running" + LABEL] == 0 and m, 30, "the pages back")
    aborted = 'tileinfer_requests_total{outcome="abort"}'
    assert after[aborted] == before[aborted] + 1
    generated = (after["vllm:generation_tokens_total" + LABEL]
                 - before["vllm:generation_tokens_total" + LABEL])
    assert generated < 400


def test_a_full_queue_answers_429_and_a_long_wait_503(server, http):
    running, _ = long_stream(http)  # the one running request (--max-running 1)
    waiting = {}
    thread = threading.Thread(target=lambda: waiting.update(r=http.post(
        "/v1/completions", json=dict(prompt="Hello", max_tokens=4))))
    thread.start()
    try:
        wait_for(lambda: metrics(server.url, AUTH)["vllm:num_requests_waiting" + LABEL] == 1,
                 30, "a waiting request")
        full = http.post("/v1/completions", json=dict(prompt="Hello", max_tokens=4))
        assert full.status_code == 429, full.text
        assert full.headers["retry-after"] == "1"
        assert full.json()["error"]["type"] == "rate_limit_error"
        thread.join(30)
        late = waiting["r"]
        assert late.status_code == 503, late.text
        assert late.json()["error"]["code"] == "queue_timeout"
        assert "limit is 2 s" in late.json()["error"]["message"]
    finally:
        running.close()
        thread.join(30)
    m = wait_for(lambda: (m := metrics(server.url, AUTH))["tileinfer_kv_pages_used"] == 0
                 and m, 30, "the pages back")
    assert m['tileinfer_requests_total{outcome="queue_timeout"}'] == 1
    assert m['tileinfer_requests_total{outcome="rejected"}'] == 1


def test_sigterm_stops_accepting_ends_requests_and_exits_cleanly(server, http):
    response, lines = long_stream(http, max_tokens=2000)
    started = time.monotonic()
    server.terminate()
    time.sleep(0.5)
    try:  # no new requests: the port is closed (or, in a race, 503)
        assert httpx.get(server.url + "/health", timeout=5).status_code == 503
    except httpx.ConnectError:
        pass
    # The running request gets --shutdown-grace (3 s), then fails with an error event.
    events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    response.close()
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "shutting_down"
    assert 2.5 < time.monotonic() - started < 60
    assert server.proc.wait(60) == 0, server.output()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url + "/health", timeout=5)
    assert "Traceback" not in server.output(), server.output()
