"""Prometheus metrics of one server (its own registry, so servers in one process never mix).

Exposed on the REST port at ``/monitoring/prometheus/metrics`` (TF Serving's path).
"""

from __future__ import annotations

import prometheus_client as prom
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServerMetrics:
    """One server's Prometheus series: requests{model,api,code}, errors, request
    latency{model,api}, batch size and model call latency{model}, dropped
    requests{model,reason}, pending requests{model}."""

    def __init__(self, model_name: str):
        self.registry = prom.CollectorRegistry()
        self._model = model_name
        self._requests = prom.Counter(
            "xgr_serving_requests", "Requests answered, by API and status code.",
            ["model_name", "api", "code"], registry=self.registry)
        self._errors = prom.Counter(
            "xgr_serving_errors", "Requests answered with an error, by API and status code.",
            ["model_name", "api", "code"], registry=self.registry)
        self._latency = prom.Histogram(
            "xgr_serving_request_latency_seconds", "Wall time from request read to response.",
            ["model_name", "api"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self._batch_rows = prom.Histogram(
            "xgr_serving_batch_size", "Rows per model call (after batching).",
            ["model_name"], buckets=_BATCH_BUCKETS, registry=self.registry)
        self._call_latency = prom.Histogram(
            "xgr_serving_model_call_seconds",
            "Wall time of each model call (one batch through the SavedModel); the request "
            "latency less this is the time a request spent decoding and waiting for its batch.",
            ["model_name"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self._dropped = prom.Counter(
            "xgr_serving_dropped_requests",
            "Requests taken out of the queue before they ran: their caller cancelled or their "
            "deadline passed.", ["model_name", "reason"], registry=self.registry)
        self._pending = prom.Gauge(
            "xgr_serving_pending_requests",
            "Requests admitted and not yet answered (decoding, queued for a batch or running), "
            "over all versions: the queue that --max_pending_requests bounds per version.",
            ["model_name"], registry=self.registry)
        self._pending.labels(model_name).set(0)
        self.registry.register(PromptCacheCollector(model_name))
        self.registry.register(EngineGraphCollector(model_name))

    def observe_request(self, api: str, code: str, seconds: float) -> None:
        self._requests.labels(self._model, api, code).inc()
        self._latency.labels(self._model, api).observe(seconds)
        if code not in ("200", "OK"):
            self._errors.labels(self._model, api, code).inc()

    def observe_batch(self, rows: int, seconds: float) -> None:
        self._batch_rows.labels(self._model).observe(rows)
        self._call_latency.labels(self._model).observe(seconds)

    def observe_drop(self, reason: str) -> None:
        self._dropped.labels(self._model, reason).inc()

    def observe_pending(self, delta: int) -> None:
        self._pending.labels(self._model).inc(delta)

    def exposition(self) -> tuple[bytes, str]:
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST


def _families(kind, prefix: str, labels: list[str], texts) -> dict:
    """One metric family of ``kind`` per (name, help text) of ``texts``, named
    ``prefix + name``, by name."""
    return {name: kind(f"{prefix}{name}", text, labels=labels) for name, text in texts}


def _package_stats() -> dict:
    """TorchCall's counters of every engine package this process loaded (by path)."""
    from custom_ops.torch_call import package_stats
    return package_stats()


class PromptCacheCollector:
    """The engine runtimes' prompt-KV caches (``xgr export --prompt_cache``), read from
    TorchCall at each scrape, one series per package: lookups, hits by tier (``device``: read
    in place; ``host``: copied back from the host tier), partial hits, misses, rows run
    uncached for want of room, evictions from the pool and from the host tier, entries, bytes
    held and capacity of each tier, and the wall time of calls whose batch had a hit."""

    def __init__(self, model_name: str, stats=_package_stats):
        self._model, self._stats = model_name, stats

    def describe(self):
        return []   # read per scrape: the packages come and go with model versions

    def collect(self):
        labels = ["model_name", "package"]
        counters = _families(CounterMetricFamily, "xgr_prompt_cache_", labels, (
            ("lookups", "Rows with a frozen part and a user key looked up."),
            ("partial_hits", "Hits that reused only part of the frozen part."),
            ("misses", "Rows whose frozen part was computed and kept."),
            ("uncached", "Rows run uncached: no room even after eviction."),
            ("evictions", "Entries evicted from the pool, least recently used "
                          "first (to the host tier when it keeps one)."),
            ("host_evictions", "Entries the host tier dropped for room."),
            ("tokens_reused", "Prompt tokens read from the cache, not prefilled."),
            ("split_batches", "Batches run as two sub-batches, the rows with "
                              "short suffixes (hits) apart from the long."),
            ("calls", "Engine calls kept (hits and misses alike)."),
            ("call_seconds", "Wall time of the calls kept."),
            ("spills", "Evicted entries copied to the host tier."),
            ("spill_seconds", "Time spent copying evicted entries to the host "
                              "tier, on the path of the request that evicted "
                              "them."),
            ("restore_seconds", "Time spent copying host-tier entries back to "
                                "the pool for a hit.")))
        hits = CounterMetricFamily("xgr_prompt_cache_hits", "Rows whose frozen part (or part "
                                   "of it) was read from the cache, by tier.",
                                   labels=labels + ["tier"])
        gauges = _families(GaugeMetricFamily, "xgr_prompt_cache_", labels, (
            ("entries", "Entries held in the pool."),
            ("bytes", "Bytes of KV held in the pool."),
            ("capacity_bytes", "The pool's size (--prompt_cache_gb)."),
            ("host_entries", "Entries held in the host tier."),
            ("host_bytes", "Bytes of KV held in the host tier."),
            ("host_capacity_bytes", "The host tier's size "
                                    "(--prompt_cache_host_gb; 0: none).")))
        latency = HistogramMetricFamily(
            "xgr_prompt_cache_hit_latency_seconds",
            "Wall time of engine calls whose batch had a hit.", labels=labels)
        try:
            packages = self._stats()
        except (OSError, ValueError):   # the op library is not loadable: no engine runs here
            packages = {}
        for path, stats in packages.items():
            cache = stats.get("prompt_cache")
            if not cache:
                continue
            values = [self._model, path]
            for name, family in counters.items():
                family.add_metric(values, cache.get(name, 0))
            host_hits = cache.get("host_hits", 0)
            hits.add_metric(values + ["device"], cache["hits"] - host_hits)
            hits.add_metric(values + ["host"], host_hits)
            for name, family in gauges.items():
                family.add_metric(values, cache.get(name, 0))
            buckets = [(str(bound), count) for bound, count in cache["hit_buckets"]]
            latency.add_metric(values, buckets + [("+Inf", cache["hit_calls"])],
                               cache["hit_seconds"])
        yield from counters.values()
        yield hits
        yield from gauges.values()
        yield latency


class EngineGraphCollector:
    """The CUDA graphs each engine package replays, read from TorchCall at each scrape, one
    series per package: calls, replays, captures (a slow call), eager runs (shapes not
    admitted to the graph budget, or every call once a capture failed), evictions, the
    graphs held and the budget. Packages that run without graphs (a CPU device) are left
    out."""

    def __init__(self, model_name: str, stats=_package_stats):
        self._model, self._stats = model_name, stats

    def describe(self):
        return []

    def collect(self):
        labels = ["model_name", "package"]
        counters = _families(CounterMetricFamily, "xgr_engine_graph_", labels, (
            ("calls", "Engine calls of a package that replays CUDA graphs."),
            ("replays", "Calls answered by replaying a captured graph."),
            ("captures", "Graphs captured: a shape bucket's first call while the "
                         "budget has room, or a shape admitted in place of a graph."),
            ("eager_runs", "Calls run without a graph (a shape not admitted, or every "
                           "call after a failed capture)."),
            ("evictions", "Graphs dropped for room (the package's graph limit).")))
        held = GaugeMetricFamily("xgr_engine_graph_held", "Graphs held now.", labels=labels)
        budget = GaugeMetricFamily("xgr_engine_graph_budget", "Graphs held at most: once "
                                   "held reaches it, new shapes run eagerly until seen "
                                   "often.", labels=labels)
        failed = GaugeMetricFamily("xgr_engine_graph_capture_failed", "1 when a capture "
                                   "failed and the package runs eagerly.", labels=labels)
        try:
            packages = self._stats()
        except (OSError, ValueError):
            packages = {}
        for path, stats in packages.items():
            if not stats.get("graphs"):
                continue
            values = [self._model, path]
            for name, family in counters.items():
                family.add_metric(values, stats.get(name, 0))
            held.add_metric(values, stats.get("held", 0))
            budget.add_metric(values, stats.get("budget", 0))
            failed.add_metric(values, 1.0 if stats.get("failure") else 0.0)
        yield from counters.values()
        yield held
        yield budget
        yield failed
