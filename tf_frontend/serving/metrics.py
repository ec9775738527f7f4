"""Prometheus metrics of one server (its own registry, so servers in one process never mix).

Exposed on the REST port at ``/monitoring/prometheus/metrics`` (TF Serving's path).
"""

from __future__ import annotations

import prometheus_client as prom

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServerMetrics:
    """requests{model,api,code}, request latency{model,api}, batch size{model}, errors,
    dropped requests{model,reason}."""

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
        self._dropped = prom.Counter(
            "xgr_serving_dropped_requests",
            "Requests taken out of the queue before they ran: their caller cancelled or their "
            "deadline passed.", ["model_name", "reason"], registry=self.registry)

    def observe_request(self, api: str, code: str, seconds: float) -> None:
        self._requests.labels(self._model, api, code).inc()
        self._latency.labels(self._model, api).observe(seconds)
        if code not in ("200", "OK"):
            self._errors.labels(self._model, api, code).inc()

    def observe_batch(self, rows: int) -> None:
        self._batch_rows.labels(self._model).observe(rows)

    def observe_drop(self, reason: str) -> None:
        self._dropped.labels(self._model, reason).inc()

    def exposition(self) -> tuple[bytes, str]:
        return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
