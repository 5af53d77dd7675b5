"""Prometheus metrics, one CollectorRegistry per app (two apps in a process never mix).

Counters and histograms are updated as requests finish; queue depth, running batch size,
capacity and memory are read from the engine at scrape time. No label ever holds request
content, a header or the API key.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..outputs import GenerationResult

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
RATE_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class _Live:
    """Gauges read when scraped: queue depth, running requests, capacity, memory, readiness."""

    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.stats = stats

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self.stats()
        for name, key, text in (
                ("celeris_queue_depth", "queued", "requests waiting for a running slot"),
                ("celeris_running_requests", "running", "requests in the running batch"),
                ("celeris_max_running", "max_running", "running batch capacity"),
                ("celeris_max_queue", "max_queue", "queue capacity"),
                ("celeris_ready", "ready", "1 when /ready answers 200"),
                ("celeris_consecutive_step_failures", "step_failures",
                 "denoising steps that failed in a row (0 after a good step)")):
            if key in s:
                yield GaugeMetricFamily(name, text, value=float(s[key]))
        if "step_failures_total" in s:
            yield CounterMetricFamily("celeris_step_failures", "denoising steps that failed",
                                      value=float(s["step_failures_total"]))
        if "memory_bytes" in s:
            g = GaugeMetricFamily("celeris_memory_bytes", "GPU memory allocated (kind=gpu) or "
                                  "process RSS (kind=rss)", labels=["kind"])
            g.add_metric([str(s.get("memory_kind", "rss"))], float(s["memory_bytes"]))
            yield g


class ServerMetrics:
    def __init__(self, stats: Callable[[], dict[str, Any]]) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("celeris_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.prompt_tokens = Counter("celeris_prompt_tokens", "prompt tokens", registry=r)
        self.generated_tokens = Counter("celeris_generated_tokens",
                                        "generated tokens before the first EOS", registry=r)
        self.nfe = Counter("celeris_nfe", "model forward evaluations", registry=r)
        self.disconnects = Counter("celeris_client_disconnects",
                                   "clients that went away before their answer was complete, "
                                   "by stage: sending (the body), waiting (for a slot), "
                                   "running (denoising, nothing sent yet), streaming",
                                   ["stage"], registry=r)
        self.finished = Counter("celeris_finished_requests", "generations by finish reason",
                                ["finish_reason"], registry=r)
        self.tokens_per_s = Histogram("celeris_request_tokens_per_second",
                                      "generated tokens / request wall time",
                                      buckets=RATE_BUCKETS, registry=r)
        self.first_block = Histogram("celeris_time_to_first_block_seconds",
                                     "time until the first block was committed",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("celeris_e2e_latency_seconds", "request wall time",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram("celeris_queue_time_seconds", "time waiting for admission",
                                    buckets=LATENCY_BUCKETS, registry=r)
        r.register(_Live(stats))

    def observe(self, result: GenerationResult) -> None:
        self.finished.labels(str(result.finish_reason)).inc()
        self.prompt_tokens.inc(result.usage.prompt_tokens)
        self.generated_tokens.inc(result.usage.completion_tokens)
        self.nfe.inc(result.nfe)
        self.tokens_per_s.observe(result.tokens_per_s)
        self.e2e.observe(result.timings.total_s)
        self.queue_time.observe(result.timings.queue_s)
        if result.timings.first_block_s is not None:
            self.first_block.observe(result.timings.first_block_s)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class StatusCounter:
    """ASGI middleware counting responses by route and status (4xx/5xx included, even those
    refused before a handler ran). Only the given paths are counted, by their own name."""

    def __init__(self, app: Any, metrics: ServerMetrics, paths: frozenset[str]) -> None:
        self.app, self.metrics, self.paths = app, metrics, paths

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in self.paths:
            return await self.app(scope, receive, send)

        async def counting_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, send=counting_send)
