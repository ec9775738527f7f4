"""``bench_train`` end to end at tiny sizes on the CPU: a stand-in of a preset's shape, a
planted log, ``xgr train`` and ``xgr evaluate`` as child processes; its table, JSON and the
loss curve beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.heavy


def test_the_training_benchmark_trains_evaluates_and_keeps_the_curve(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_train", "--users=120",
                           "--steps=30", f"--out_dir={tmp_path}", "--label=smoke"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "recall@10: model" in done.stdout
    (path,) = tmp_path.glob("train_*_smoke.json")
    result = json.loads(path.read_text())
    assert result["events"] == 120 * 12 and result["steps"] == 30
    assert result["train_users"] == 108 and result["examples"] == 108 * 8
    assert len(result["losses"]) == 30 and result["steps_per_second"] > 0
    assert set(result["recall_at_10"]) == {"model", "popularity", "co-occurrence"}
    assert (tmp_path / result["loss_curve"]).stat().st_size > 0
    assert result["commit"]
