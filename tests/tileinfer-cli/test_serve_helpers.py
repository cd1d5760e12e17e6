"""Helpers of the ``tileinfer serve`` tests (no tests here): a server process on a free loopback
port, a tiny random-weight model folder with SmolLM2's tokenizer, Prometheus text parsing and
a raw server-sent-events reader."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

# A llama of SmolLM2's vocabulary (so its tokenizer and chat template serve it) and a tiny
# shape, served with --load-format dummy: random weights of this shape (seed 0), which the
# tests rebuild in-process with random_model to compute the offline engine's output.
TINY_CONFIG = dict(model_type="llama", vocab_size=49152, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5,
                   rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1,
                   eos_token_id=2)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def tiny_folder(smollm2_dir: Path, root: Path, generation: dict | None = None,
                template: str | None = None) -> Path:
    """The tiny model's folder; generation: keys to add to generation_config.json; template: a
    chat_template.jinja that replaces SmolLM2's."""
    folder = root / "tiny-smollm2-shape"
    folder.mkdir(exist_ok=True)
    for name in TOKENIZER_FILES:
        if (smollm2_dir / name).exists():
            shutil.copy(smollm2_dir / name, folder / name)
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    if generation:
        path = folder / "generation_config.json"
        settings = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**settings, **generation}))
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m tileinfer_cli serve ARGS`` on a free loopback port; ``start`` waits until
    /health answers."""

    def __init__(self, args, log_path: Path, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "tileinfer_cli", "serve", "--port", str(self.port),
               "--threads", "1", "--log-level", "warning", *map(str, args)]
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()

    def wait_ready(self, timeout: float = 300):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}):\n"
                                   f"{self.output()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not start in {timeout} s:\n{self.output()}")

    def terminate(self):
        self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        return self.proc.returncode


def metrics(url: str, headers=None) -> dict[str, float]:
    """The server's Prometheus samples: {"name{labels}": value}."""
    text = httpx.get(url + "/metrics", headers=headers, timeout=10).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def sse_events(response) -> list:
    """The JSON payloads of a streamed response's events, and "[DONE]"."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def wait_for(predicate, timeout: float = 30, what: str = "a condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
