"""``xgr demo`` and example (a), each as a user runs them: in a fresh process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import child_env

# Heavy (runs `xgr demo` and the examples in fresh processes): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[2]


def test_demo_prints_items_timings_and_recall(quick_run):
    _, stdout, report = quick_run
    assert "default model (tiny): fitted in" in stdout
    assert "(a) top items of 2 held-out users" in stdout
    assert len(re.findall(r"^user \d+ \(\w+\): \d+ past events", stdout, re.M)) == 2
    assert re.search(r"^\s+1\s+\d+\s+\d+-\d+-\d+\s+-\d+\.\d{3}", stdout, re.M)
    for stage in ("feature_graph", "bridge_in", "engine", "bridge_out", "post_process",
                  "total"):
        assert re.search(rf"^\s+{stage}\s+\d+\.\d{{3}}", stdout, re.M), stage
    assert "(c) recall@K on 300 held-out users" in stdout
    for k in ("10", "50", "100"):
        model, popular = report["recall"][k]["model"], report["recall"][k]["popularity"]
        assert re.search(rf"^\s+{k}\s+{model:.3f}\s+{popular:.3f}\s", stdout, re.M), k


def test_demo_second_run_loads_the_cached_fit(quick_run, xgr):
    cache = quick_run[0]
    proc = xgr("demo", "--quick", f"--cache_dir={cache}", "--users=20", "--batch_size=20",
               "--show_users=1", "--beam_width=32", "--top_k=20")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"default model \(tiny\): loaded in \d+\.\d s", proc.stdout)
    assert "(c) recall@K on 20 held-out users" in proc.stdout


def test_demo_rejects_a_bad_flag(xgr, tmp_path):
    proc = xgr("demo", "--quick", f"--cache_dir={tmp_path}", "--top_k=nope")
    assert proc.returncode != 0
    assert "top_k" in proc.stderr


def test_example_generative_retrieval_runs(quick_run):
    env = child_env(TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "examples/generative_retrieval.py", "--quick",
                           f"--cache_dir={quick_run[0]}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"user \d+: top 5 items \[\d+, \d+, \d+, \d+, \d+\]", proc.stdout)
    assert re.search(r"recall@50 on 32 held-out users: model \d\.\d\d, popularity \d\.\d\d",
                     proc.stdout)
