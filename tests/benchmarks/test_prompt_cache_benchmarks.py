"""The prompt cache's two benchmarks run end to end at tiny sizes on the CPU: the hit
latency beside the uncached engine (items of the hit equal the uncached engine's), and the
hit-rate simulation (its table, JSON and plot, more hits with a bigger pool). The cache
through ``xgr serve`` is in ``test_serving_benchmarks.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.heavy


def _run(module: str, *flags: str) -> str:
    done = subprocess.run([sys.executable, "-m", module, *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_hit_latency_benchmark_writes_its_result(tmp_path):
    out = _run("benchmarks.bench_prompt_cache", "--device=cpu", "--cases=tiny:48:24",
               "--items=2000", "--paths=2000", "--repeats=2", "--beam=8", "--top_k=10",
               "--profile", f"--out={tmp_path}")
    assert "tiny:48:24" in out and "tiny hit:" in out
    (path,) = tmp_path.glob("prompt_cache_*.json")
    result = json.loads(path.read_text())
    case = result["cases"][0]
    assert result["commit"] and case["items_equal_to_uncached"] == case["items_compared"]
    assert case["items_in_both"] == case["items_compared"] and case["page_tokens"] == 64
    assert set(case["medians_ms"]) == {"uncached", "hit (device pool)",
                                       "miss (computed and stored)",
                                       "host-tier copy (added to a hit)"}
    assert case["cache_stats"]["device_hits"] > 0
    assert set(case["kernels_us"]) == {"uncached", "hit"}
    for host in case["host_us"].values():      # where the captured calls' host time goes
        assert host["wall"] > 0 and any("engine.py" in key for key in host)
    assert any("prompt_rows" in key for key in case["host_us"]["hit"])
    assert case["replay_ms"] == {"uncached": None, "hit": None, "miss": None}   # no graphs here


def test_the_timeline_lists_a_calls_host_functions():
    """``timeline`` (``--timeline`` on CUDA) on the CPU: no GPU activity to place, but the
    call's slowest functions from Python's profiler, slowest first."""
    import torch

    from benchmarks.bench_prompt_cache import replay_parts, timeline

    def call():
        return torch.ones(256).cumsum(0)

    line = timeline(call, calls=3)
    assert line["first"] == [] and "lead" not in line
    names = [name for name, _ in line["host"]]
    assert any("call" in name for name in names), names
    times = [us for _, us in line["host"]]
    assert times == sorted(times, reverse=True) and times[0] > 0
    assert replay_parts(None, 1.0) is None


def test_the_hit_rate_simulation_plots_hits_against_the_pool(tmp_path):
    out = _run("benchmarks.bench_prompt_cache_hits", "--population=300", "--rate=5",
               "--hours=0.05", "--frozen_tokens=400", "--device_gb=0.2,2", "--host_gb=2",
               f"--out={tmp_path}")
    assert "tokens reused" in out
    (path,) = tmp_path.glob("prompt_cache_hits_*.json")
    result = json.loads(path.read_text())
    assert Path(result["plot"]).exists()
    small, large = result["rows"][:2]
    assert 0 <= small["hit_rate"] < large["hit_rate"] <= 1
    assert result["workload"]["return_intervals"]["returns"] > 0
