"""Prometheus metrics of one server (its own registry, served at ``GET /metrics``).

Counted as they happen: requests by outcome (stop, length, abort: the client went away,
error, queue_timeout, rejected: 429, invalid: 4xx before running), prompt and generated tokens,
time to first token and inter-token latency (seconds, measured where the engine's thread hands
over each step's tokens). Read from the engine at each scrape: running and waiting requests, KV
pages in use, cached (unreferenced prefix pages kept for reuse), free and total, preemptions,
prefix-cache hit tokens, engine steps.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

OUTCOMES = ("stop", "length", "abort", "error", "queue_timeout", "rejected", "invalid")
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)


class _EngineCollector:
    def __init__(self, engine, jobs):
        self.engine, self.jobs = engine, jobs

    def collect(self):
        s = self.engine.stats()
        gauges = [("requests_running", "requests holding KV pages and running", s["running"]),
                  ("requests_waiting", "requests queued for the engine", s["waiting"]),
                  ("http_requests_in_flight", "completion requests being answered",
                   self.jobs()),
                  ("kv_pages_used", "KV pages referenced by requests", s["pages_used"]),
                  ("kv_pages_cached", "unreferenced prefix pages kept for reuse",
                   s["pages_cached"]),
                  ("kv_pages_free", "KV pages neither used nor cached", s["pages_free"]),
                  ("kv_pages_total", "KV pages in the pool", s["pages_total"])]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(f"tileinfer_{name}", doc, value=value)
        counters = [("preemptions", "requests preempted for pages", s["preemptions"]),
                    ("prefix_cache_hit_tokens", "prompt tokens taken from the prefix cache",
                     s["prefix_hit_tokens"]),
                    ("engine_steps", "engine steps run", s["steps"])]
        for name, doc, value in counters:
            yield CounterMetricFamily(f"tileinfer_{name}", doc, value=value)


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("tileinfer_requests", "completion requests by outcome",
                                ["outcome"], registry=r)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.prompt_tokens = Counter("tileinfer_prompt_tokens", "prompt tokens of requests run",
                                     registry=r)
        self.generated_tokens = Counter("tileinfer_generation_tokens",
                                        "tokens generated (every choice)", registry=r)
        self.ttft = Histogram("tileinfer_time_to_first_token_seconds",
                              "from a request's arrival to its first token", buckets=TTFT_BUCKETS,
                              registry=r)
        self.itl = Histogram("tileinfer_inter_token_latency_seconds",
                             "between a choice's consecutive tokens", buckets=ITL_BUCKETS,
                             registry=r)

    def watch_engine(self, engine, jobs_in_flight):
        self.registry.register(_EngineCollector(engine, jobs_in_flight))

    def outcome(self, outcome: str):
        self.requests.labels(outcome).inc()

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
