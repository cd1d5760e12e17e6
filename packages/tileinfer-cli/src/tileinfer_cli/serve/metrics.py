"""Prometheus metrics of one server (its own registry, served at ``GET /metrics``).

Under vLLM's names (label ``model_name``), so that dashboards made for vLLM work:
``vllm:num_requests_running`` / ``_waiting`` and ``vllm:kv_cache_usage_perc`` (pages held by
requests / all pages, 0..1) read from the engine at each scrape; ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``, ``vllm:num_preemptions_total``; the histograms
``vllm:time_to_first_token_seconds`` (arrival to first token), ``vllm:e2e_request_latency_seconds``
(arrival to the last token, finished requests), ``vllm:request_queue_time_seconds`` (arrival to
the start of the engine step that gave the first token: an estimate, since the engine does not
report when it admits a request, which counts the earlier chunks of a prompt prefilled over
several steps), ``vllm:time_per_output_token_seconds`` (between a choice's consecutive tokens;
also as ``vllm:inter_token_latency_seconds``, vLLM's newer name); and
``vllm:request_success_total`` by ``finished_reason`` (stop, length, abort, error).

TileInfer's own, where vLLM has no name: ``tileinfer_requests_total`` by outcome (those reasons,
and queue_timeout, rejected: 429, invalid: 4xx before running), KV pages used, cached
(unreferenced prefix pages kept for reuse), free and total, prefix-cache hit tokens, engine steps
(and pipelined ones), completion requests being answered.

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
FINISHED_REASONS = ("stop", "length", "abort", "error")  # vllm:request_success_total's
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1,
               0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                   30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class Histogram:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: +Inf
        self.sum = 0.0

    def observe(self, value: float):
        self.counts[bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.sum += value

    def family(self, name: str, doc: str, model: str) -> HistogramMetricFamily:
        family = HistogramMetricFamily(name, doc, labels=["model_name"])
        buckets, total = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            total += count
            buckets.append((bound, total))
        family.add_metric([model], buckets, self.sum)
        return family


def _one(kind, name: str, doc: str, model: str, value):
    family = kind(name, doc, labels=["model_name"])
    family.add_metric([model], value)
    return family


class Metrics:
    def __init__(self, model_name: str):
        self.model = model_name
        self.requests = dict.fromkeys(OUTCOMES, 0)
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_BUCKETS)
        self.queue = Histogram(REQUEST_BUCKETS)
        self.engine = None
        self.jobs_in_flight = lambda: 0
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def watch_engine(self, engine, jobs_in_flight):
        self.engine, self.jobs_in_flight = engine, jobs_in_flight

    def outcome(self, outcome: str):
        self.requests[outcome] += 1

    def collect(self):
        m = self.model
        success = CounterMetricFamily("vllm:request_success", "finished requests by reason",
                                      labels=["model_name", "finished_reason"])
        for reason in FINISHED_REASONS:
            success.add_metric([m, reason], self.requests[reason])
        yield success
        yield _one(CounterMetricFamily, "vllm:prompt_tokens", "prompt tokens of requests run",
                   m, self.prompt_tokens)
        yield _one(CounterMetricFamily, "vllm:generation_tokens",
                   "tokens generated (every choice)", m, self.generated_tokens)
        yield self.ttft.family("vllm:time_to_first_token_seconds",
                               "from a request's arrival to its first token", m)
        itl = "between a choice's consecutive tokens"
        yield self.itl.family("vllm:time_per_output_token_seconds", itl, m)
        yield self.itl.family("vllm:inter_token_latency_seconds", itl, m)
        yield self.e2e.family("vllm:e2e_request_latency_seconds",
                              "from a finished request's arrival to its last token", m)
        yield self.queue.family("vllm:request_queue_time_seconds",
                                "from a request's arrival to the start of the engine step that "
                                "gave its first token (an estimate)", m)
        requests = CounterMetricFamily("tileinfer_requests", "completion requests by outcome",
                                       labels=["outcome"])
        for outcome, n in self.requests.items():
            requests.add_metric([outcome], n)
        yield requests
        yield GaugeMetricFamily("tileinfer_http_requests_in_flight",
                                "completion requests being answered",
                                value=self.jobs_in_flight())
        if self.engine is None:
            return
        s = self.engine.stats()
        yield _one(GaugeMetricFamily, "vllm:num_requests_running",
                   "requests holding KV pages and running", m, s["running"])
        yield _one(GaugeMetricFamily, "vllm:num_requests_waiting",
                   "requests queued for the engine", m, s["waiting"])
        yield _one(GaugeMetricFamily, "vllm:kv_cache_usage_perc",
                   "KV pages held by requests / all pages (1: full)", m,
                   s["pages_used"] / max(1, s["pages_total"]))
        yield _one(CounterMetricFamily, "vllm:num_preemptions",
                   "requests preempted for pages", m, s["preemptions"])
        yield _one(CounterMetricFamily, "vllm:prefix_cache_queries",
                   "prompt tokens looked up in the prefix cache", m, s["prefix_query_tokens"])
        yield _one(CounterMetricFamily, "vllm:prefix_cache_hits",
                   "prompt tokens found in the prefix cache", m, s["prefix_hit_tokens"])
        gauges = [("kv_pages_used", "KV pages referenced by requests", s["pages_used"]),
                  ("kv_pages_cached", "unreferenced prefix pages kept for reuse",
                   s["pages_cached"]),
                  ("kv_pages_free", "KV pages neither used nor cached", s["pages_free"]),
                  ("kv_pages_total", "KV pages in the pool", s["pages_total"])]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(f"tileinfer_{name}", doc, value=value)
        counters = [("prefix_cache_hit_tokens", "prompt tokens taken from the prefix cache",
                     s["prefix_hit_tokens"]),
                    ("engine_steps", "engine steps run", s["steps"]),
                    ("engine_pipelined_steps", "engine steps launched before the previous "
                     "step's tokens were read", s["pipelined_steps"])]
        for name, doc, value in counters:
            yield CounterMetricFamily(f"tileinfer_{name}", doc, value=value)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
