"""Prometheus metrics of one server (its own registry, served at ``GET /metrics``).

Counted as they happen: requests by outcome (stop, length, abort: the client went away,
error, queue_timeout, rejected: 429, invalid: 4xx before running), prompt and generated tokens,
time to first token and inter-token latency (seconds, measured where the engine's thread hands
over each step's tokens). Read from the engine at each scrape: running and waiting requests, KV
pages in use, cached (unreferenced prefix pages kept for reuse), free and total, preemptions,
prefix-cache hit tokens, engine steps.

Tokens are counted and latencies observed once per token on the asyncio loop, the server's hot
path: plain integers and a bisect into bucket counts (a fraction of a microsecond), turned into
Prometheus families when scraped, instead of prometheus-client's locked metric objects.
Everything is updated and read on the loop's thread.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily)

OUTCOMES = ("stop", "length", "abort", "error", "queue_timeout", "rejected", "invalid")
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)


class Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: +Inf
        self.sum = 0.0

    def observe(self, value: float):
        self.counts[bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.sum += value

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        buckets, total = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            total += count
            buckets.append((bound, total))
        return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=self.sum)


class Metrics:
    def __init__(self):
        self.requests = dict.fromkeys(OUTCOMES, 0)
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.engine = None
        self.jobs_in_flight = lambda: 0
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def watch_engine(self, engine, jobs_in_flight):
        self.engine, self.jobs_in_flight = engine, jobs_in_flight

    def outcome(self, outcome: str):
        self.requests[outcome] += 1

    def collect(self):
        requests = CounterMetricFamily("tileinfer_requests", "completion requests by outcome",
                                       labels=["outcome"])
        for outcome, n in self.requests.items():
            requests.add_metric([outcome], n)
        yield requests
        yield CounterMetricFamily("tileinfer_prompt_tokens", "prompt tokens of requests run",
                                  value=self.prompt_tokens)
        yield CounterMetricFamily("tileinfer_generation_tokens",
                                  "tokens generated (every choice)", value=self.generated_tokens)
        yield self.ttft.family("tileinfer_time_to_first_token_seconds",
                               "from a request's arrival to its first token")
        yield self.itl.family("tileinfer_inter_token_latency_seconds",
                              "between a choice's consecutive tokens")
        yield GaugeMetricFamily("tileinfer_http_requests_in_flight",
                                "completion requests being answered",
                                value=self.jobs_in_flight())
        if self.engine is None:
            return
        s = self.engine.stats()
        gauges = [("requests_running", "requests holding KV pages and running", s["running"]),
                  ("requests_waiting", "requests queued for the engine", s["waiting"]),
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
                    ("engine_steps", "engine steps run", s["steps"]),
                    ("engine_pipelined_steps", "engine steps launched before the previous "
                     "step's tokens were read", s["pipelined_steps"])]
        for name, doc, value in counters:
            yield CounterMetricFamily(f"tileinfer_{name}", doc, value=value)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
