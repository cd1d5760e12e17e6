"""The server's key check with ``--metrics-public``, and vLLM's prefix-cache counters, without a
server process: the ASGI guard on request scopes, the metrics on a real engine."""

from types import SimpleNamespace

import pytest
import torch

for _module in ("starlette", "prometheus_client"):
    pytest.importorskip(_module)

from tileinfer import LLMEngine, load_model  # noqa: E402
from tileinfer_cli.serve.app import Guard  # noqa: E402
from tileinfer_cli.serve.metrics import Metrics  # noqa: E402
from tiny_models import prompt_ids, tiny  # noqa: E402,F401


def scope(path, key=None):
    headers = [(b"authorization", b"Bearer " + key)] if key else []
    return {"type": "http", "path": path, "headers": headers}


@pytest.mark.parametrize("public", [False, True])
def test_metrics_need_the_key_unless_public(public):
    server = SimpleNamespace(api_key=b"k3y", max_body=1 << 20, metrics_public=public)
    guard = Guard(None, server)
    assert (guard.check(scope("/metrics")) is None) == public
    assert guard.check(scope("/metrics", b"k3y")) is None
    assert guard.check(scope("/health")) is None
    refused = guard.check(scope("/v1/models"))  # every other path still needs the key
    assert refused is not None and refused.status == 401


def samples(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_prefix_cache_queries_and_hits_under_vllms_names(tiny):
    model = load_model(tiny.directory("llama"), dtype=torch.float32, max_len=128)
    engine = LLMEngine(model, cpu_tokens=1024, page_size=16)
    metrics = Metrics("tiny")
    metrics.watch_engine(engine, lambda: 0)
    shared = prompt_ids(40, seed=5)
    for tail in (prompt_ids(4, seed=6), prompt_ids(4, seed=7)):  # one after the other
        engine.add_request(shared + tail, max_new_tokens=2, stop_ids=[])
        while engine.has_unfinished():
            engine.step()
    got = samples(metrics.render().decode())
    label = '{model_name="tiny"}'
    assert got[f"vllm:prefix_cache_queries_total{label}"] == 2 * 44
    # The second prompt finds the first one's two full pages of the shared 40 tokens.
    assert got[f"vllm:prefix_cache_hits_total{label}"] == 32
