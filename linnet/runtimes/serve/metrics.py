"""`/metrics` of `linnet serve`: Prometheus text through prometheus-client, named as vLLM names its metrics.

vLLM's `vllm/v1/metrics/loggers.py` (`PrometheusStatLogger`) prefixes every name with `vllm:` and labels it with
`model_name`; Linnet mirrors the names it has an equivalent for, prefixed `linnet:` (docs/serving.md lists them):

- gauges read from `Engine.stats()` at each scrape: `linnet:num_requests_running`, `linnet:num_requests_waiting`,
  `linnet:cache_rows_in_use` and `linnet:cache_rows_total` (vLLM reports blocks as `kv_cache_usage_perc`; Linnet's
  cache is `max_batch` fixed rows, so `linnet:kv_cache_usage_perc` is rows in use over rows);
- counters, also from `Engine.stats()`: `linnet:prompt_tokens_total`, `linnet:generation_tokens_total`; and
  `linnet:request_success_total{finished_reason}` counted here as requests finish;
- histograms of each finished request's `Finished` timings (monotonic seconds, measured by the engine):
  `linnet:time_to_first_token_seconds`, `linnet:inter_token_latency_seconds`,
  `linnet:e2e_request_latency_seconds`, `linnet:request_queue_time_seconds`, and its sizes
  `linnet:request_prompt_tokens`, `linnet:request_generation_tokens`; buckets as vLLM's.

Each app owns its own `CollectorRegistry`, so several apps in one process (tests) do not collide.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["ServerMetrics"]

# vLLM's buckets (vllm/v1/metrics/loggers.py), seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)
FINISH_REASONS = ("stop", "length", "cancelled", "error")  # the engine's `Finished.finish_reason`s
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class _EngineCollector:
    """Gauges and token counters read from `engine.stats()` when Prometheus scrapes."""

    def __init__(self, engine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self):
        stats = self.engine.stats()
        label = [self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(f"linnet:{name}", doc, labels=["model_name"])
            family.add_metric(label, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(f"linnet:{name}", doc, labels=["model_name"])
            family.add_metric(label, value)
            return family

        yield gauge("num_requests_running", "Requests holding a cache row.", stats.running)
        yield gauge("num_requests_waiting", "Requests waiting for a cache row.", stats.waiting)
        yield gauge("cache_rows_in_use", "Cache rows held by requests.", stats.rows_in_use)
        yield gauge("cache_rows_total", "Cache rows (--max-batch).", stats.max_batch)
        yield gauge("kv_cache_usage_perc", "Fraction of cache rows in use (1 = full).", _ratio(stats))
        yield counter("prompt_tokens", "Prompt tokens prefilled.", stats.prompt_tokens_total)
        yield counter("generation_tokens", "Tokens generated.", stats.generation_tokens_total)


def _ratio(stats) -> float:
    return stats.rows_in_use / stats.max_batch if stats.max_batch else 0.0


class ServerMetrics:
    """The registry behind `/metrics` for one engine and served model name."""

    def __init__(self, engine, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.registry.register(_EngineCollector(engine, model_name))

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(f"linnet:{name}", doc, ["model_name"], registry=self.registry, buckets=buckets)

        self.success = Counter(
            "linnet:request_success",
            "Requests finished, by finish reason (stop, length, cancelled, error).",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.ttft = histogram("time_to_first_token_seconds", "Submit to first token.", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Gap between consecutive tokens.", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Submit to finish.", REQUEST_BUCKETS)
        self.queue = histogram("request_queue_time_seconds", "Submit to admission into a row.", REQUEST_BUCKETS)
        self.prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
        self.generation_tokens = histogram("request_generation_tokens", "Generated tokens per request.", TOKEN_BUCKETS)
        # every series exists (at 0) from the start, as vLLM's do, so dashboards and rate() see them at once
        for reason in FINISH_REASONS:
            self.success.labels(model_name, reason)
        for family in (self.ttft, self.itl, self.e2e, self.queue, self.prompt_tokens, self.generation_tokens):
            family.labels(model_name)

    def observe(self, finished) -> None:
        """Record one engine request's `Finished` event (timings in seconds, from the engine's monotonic clock)."""
        name = self.model_name
        self.success.labels(name, finished.finish_reason).inc()
        self.e2e.labels(name).observe(finished.e2e_s)
        if finished.queued_s is not None:
            self.queue.labels(name).observe(finished.queued_s)
        if finished.ttft_s is not None:
            self.ttft.labels(name).observe(finished.ttft_s)
        itl = self.itl.labels(name)
        for gap in finished.inter_token_s:
            itl.observe(gap)
        self.prompt_tokens.labels(name).observe(finished.prompt_tokens)
        self.generation_tokens.labels(name).observe(finished.completion_tokens)

    def render(self) -> bytes:
        """The Prometheus text exposition (`text/plain; version=0.0.4`)."""
        return generate_latest(self.registry)
