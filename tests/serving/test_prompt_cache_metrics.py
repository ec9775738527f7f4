"""The prompt cache's Prometheus series (``tf_frontend.serving.metrics.PromptCacheCollector``)
from the stats TorchCall reports: hits split by tier, each tier's size, a package without a
cache left out."""

from __future__ import annotations

import prometheus_client as prom

from tf_frontend.serving.metrics import EngineGraphCollector, PromptCacheCollector

STATS = {"lookups": 40, "hits": 25, "host_hits": 7, "partial_hits": 3, "misses": 12,
         "uncached": 3, "evictions": 9, "host_evictions": 2, "tokens_reused": 900,
         "tokens_written": 400, "entries": 5, "bytes": 1 << 20, "capacity_bytes": 4 << 20,
         "host_entries": 4, "host_bytes": 3 << 20, "host_capacity_bytes": 8 << 20,
         "hit_calls": 20, "hit_seconds": 0.25, "hit_buckets": [[0.01, 15], [0.1, 20]],
         "split_batches": 2, "calls": 30, "call_seconds": 1.5, "spills": 9,
         "spill_seconds": 0.45, "restore_seconds": 0.07}


def _registry(packages: dict) -> prom.CollectorRegistry:
    registry = prom.CollectorRegistry()
    registry.register(PromptCacheCollector("recs", stats=lambda: packages))
    return registry


def test_hits_are_split_by_tier_and_each_tier_has_its_size():
    registry = _registry({"/m/1/engine.pt2": {"prompt_cache": STATS}, "/m/1/other.pt2": {}})
    labels = {"model_name": "recs", "package": "/m/1/engine.pt2"}
    value = registry.get_sample_value
    assert value("xgr_prompt_cache_hits_total", {**labels, "tier": "device"}) == 18
    assert value("xgr_prompt_cache_hits_total", {**labels, "tier": "host"}) == 7
    assert value("xgr_prompt_cache_host_evictions_total", labels) == 2
    assert value("xgr_prompt_cache_split_batches_total", labels) == 2
    assert value("xgr_prompt_cache_host_bytes", labels) == 3 << 20
    assert value("xgr_prompt_cache_host_capacity_bytes", labels) == 8 << 20
    assert value("xgr_prompt_cache_capacity_bytes", labels) == 4 << 20
    assert value("xgr_prompt_cache_hit_latency_seconds_count", labels) == 20
    assert value("xgr_prompt_cache_calls_total", labels) == 30
    assert value("xgr_prompt_cache_spills_total", labels) == 9
    assert value("xgr_prompt_cache_spill_seconds_total", labels) == 0.45
    assert value("xgr_prompt_cache_restore_seconds_total", labels) == 0.07
    assert value("xgr_prompt_cache_lookups_total",
                 {"model_name": "recs", "package": "/m/1/other.pt2"}) is None


def test_stats_of_a_runtime_without_the_host_fields_read_as_no_host_tier():
    old = {k: v for k, v in STATS.items() if not k.startswith("host_")}
    registry = _registry({"/m/1/engine.pt2": {"prompt_cache": old}})
    labels = {"model_name": "recs", "package": "/m/1/engine.pt2"}
    assert registry.get_sample_value("xgr_prompt_cache_hits_total",
                                     {**labels, "tier": "device"}) == 25
    assert registry.get_sample_value("xgr_prompt_cache_hits_total",
                                     {**labels, "tier": "host"}) == 0


def test_graph_series_count_captures_and_leave_packages_without_graphs_out():
    registry = prom.CollectorRegistry()
    graphed = {"graphs": True, "calls": 50, "replays": 44, "captures": 6, "eager_runs": 0,
               "evictions": 1, "held": 5, "budget": 8, "failure": ""}
    failed = {**graphed, "failure": "out of memory", "eager_runs": 3}
    registry.register(EngineGraphCollector("recs", stats=lambda: {
        "/m/1/engine.pt2": graphed, "/m/2/engine.pt2": failed,
        "/m/1/cpu.pt2": {"graphs": False}}))
    value = registry.get_sample_value

    def labels(path):
        return {"model_name": "recs", "package": path}
    assert value("xgr_engine_graph_captures_total", labels("/m/1/engine.pt2")) == 6
    assert value("xgr_engine_graph_replays_total", labels("/m/1/engine.pt2")) == 44
    assert value("xgr_engine_graph_held", labels("/m/1/engine.pt2")) == 5
    assert value("xgr_engine_graph_budget", labels("/m/1/engine.pt2")) == 8
    assert value("xgr_engine_graph_capture_failed", labels("/m/1/engine.pt2")) == 0
    assert value("xgr_engine_graph_capture_failed", labels("/m/2/engine.pt2")) == 1
    assert value("xgr_engine_graph_eager_runs_total", labels("/m/2/engine.pt2")) == 3
    assert value("xgr_engine_graph_calls_total", labels("/m/1/cpu.pt2")) is None
