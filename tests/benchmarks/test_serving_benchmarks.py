"""The serving benchmarks that share one session workload run end to end at tiny sizes on
the CPU, over one pair of exports: the prompt cache through ``xgr serve`` (plain and cached
SavedModels), the replicas behind ``xgr serve --replicas`` (the cached one), and ``xgr batch``
on a local Ray cluster (the plain one); and the tensor-parallel benchmark on two gloo
processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.heavy
# The world every benchmark here is run with (the exports' and the requests').
WORLD = ("--population=20", "--long_items=12", "--recent_items=4")


def _run(module: str, *flags: str) -> str:
    done = subprocess.run([sys.executable, "-m", module, *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _result(folder: Path, prefix: str) -> dict:
    (path,) = folder.glob(f"{prefix}_*.json")
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def served_cache(tmp_path_factory):
    """``bench_served_cache`` at tiny sizes: (its output, its result, its work folder with
    the plain/ and cached/ exports)."""
    folder = tmp_path_factory.mktemp("served_cache")
    out = _run("benchmarks.bench_served_cache", *WORLD, "--rates=3", "--rate_seconds=4",
               "--warmup_seconds=2", "--verify_requests=0", "--parallel_exports",
               "--export_flags=--catalog_headroom=1.5", f"--work={folder / 'work'}",
               f"--out_dir={folder}")
    return out, _result(folder, "served_cache"), folder / "work"


def test_the_served_cache_benchmark_serves_both_and_compares(served_cache):
    """Both SavedModels served: no request fails, the cached server answers as the plain one
    (float32), users who return hit."""
    out, result, _ = served_cache
    assert "at P99 <=" in out
    (plain,), (cached,) = result["plain"], result["cached"]
    assert plain["failed"] == cached["failed"] == 0 and result["wrong_answers"] == 0
    assert result["differing_answers"] == 0     # float32 on the CPU: the same items
    assert result["precision"] is None          # exact at float32: nothing to settle
    assert cached["cache"]["hits"] > 0 and 0 < cached["hit_rate"] <= 1
    assert result["plain_best_rate"] and result["cached_best_rate"]
    assert result["workload"]["returns"] > 0
    # The warm-up ran on each server, apart from the sweep; the cached calls were timed
    # (no host tier: nothing spilled); a CPU engine captures no graphs.
    assert set(result["warmup"]) == {"plain", "cached"}
    assert result["warmup"]["cached"]["answered"] > 0
    assert cached["call_ms"] > 0 and cached["spill_ms_per_call"] == 0
    # Each window's time split: a request on the server, its model call, the engine's runs
    # with a hit and without (a miss's run also stores), and their sum with the copies.
    for row in (plain, cached):
        assert 0 < row["model_call_ms"] and 0 < row["server_ms"] and row["rows_per_call"] >= 1
    assert cached["hit_call_ms"] > 0 and cached["miss_call_ms"] > 0
    assert cached["engine_ms_per_call"] == pytest.approx(
        cached["call_ms"] + cached["spill_ms_per_call"] + cached["restore_ms_per_call"])
    assert "on the server" in out and "with a hit" in out
    assert plain["graph_captures"] == cached["graph_captures"] == 0


def test_the_export_flags_reach_both_exports(served_cache):
    """``--export_flags`` go to the plain and the cached export alike (the servers then
    differ only in the cache), and the result records them."""
    _, result, work = served_cache
    assert result["export_flags"] == ["--catalog_headroom=1.5"]
    for name in ("plain", "cached"):
        report = json.loads((work / f"{name}.report.json").read_text())
        assert report["capacity"], (name, report)
    assert result["export_checks"] == {"plain": None, "cached": None}   # --verify_requests=0


def test_the_replica_benchmark_scales_one_export_over_two_replicas(served_cache, tmp_path):
    """One server, then a front over two replicas: both answer every request as the single
    server did (two client processes), both replicas take requests, returning users hit
    their replica's cache."""
    _, _, work = served_cache
    out = _run("benchmarks.bench_replicas", *WORLD, f"--saved_model={work / 'cached'}",
               "--replica_counts=1,2", "--rates_per_replica=3", "--rate_seconds=3",
               "--client_processes=2",
               f"--work={tmp_path / 'work'}", f"--out_dir={tmp_path}")
    assert "efficiency" in out
    result = _result(tmp_path, "replicas")
    one, two = result["counts"]
    assert (one["replicas"], two["replicas"]) == (1, 2)
    assert result["wrong_answers"] == 0
    assert all(row["failed"] == 0 for c in result["counts"] for row in c["rows"])
    assert one["best_rate"] and two["best_rate"] and two["efficiency"] > 0
    (row,) = two["rows"]
    assert sum(row["answered_by_replica"].values()) == row["answered"]
    assert all(row["hit_rate"] > 0 for c in result["counts"] for row in c["rows"])


def test_the_batch_benchmark_answers_as_the_direct_calls(served_cache, tmp_path):
    _, _, work = served_cache
    out = _run("benchmarks.bench_batch", "--users=60", "--rows_per_shard=20",
               "--long_items=12", "--recent_items=4", f"--saved_model={work / 'plain'}",
               "--local_cpus=2", f"--work={tmp_path / 'work'}", f"--out_dir={tmp_path}")
    assert "direct" in out
    result = _result(tmp_path, "batch")
    (row,) = result["rows"]
    assert row["users"] == 60 and row["refused"] == 0
    assert row["differing_from_direct"] == 0 and result["direct_users_per_second"] > 0


def test_the_tensor_parallel_benchmark_gives_every_rank_the_same_items(tmp_path):
    out = _run("benchmarks.bench_tensor_parallel", "--device=cpu", "--preset=tiny",
               "--worlds=1,2", "--prompt=64", "--beam=8", "--top_k=10", "--items=2000",
               "--paths=2000", "--repeats=2", f"--out={tmp_path}")
    assert "world" in out
    result = _result(tmp_path, "tensor_parallel")
    one, two = result["rows"]
    assert (one["world"], two["world"]) == (1, 2)
    assert one["same_items_on_every_rank"] and two["same_items_on_every_rank"]
    assert two["heads_per_rank"] * 2 == one["heads_per_rank"]
    # float32 on the CPU: two ranks' sums give the single process's items.
    assert two["items_against_first"]["rows_equal"] == two["items_against_first"]["rows"]
    assert one["allreduce_ms"] == 0 and two["allreduce_ms"] > 0
    assert result["environment"]["NCCL_NVLS_ENABLE"] == "0"
