"""``xgr export --device cuda``: the engine compiled for the GPU inside the pipeline SavedModel;
reloaded in a fresh process (TF + custom_ops only, TF's graph on the CPU, TorchCall moving the
prompt to the GPU and the items back) it returns exactly the items of the Python pipeline
running the same engine on the GPU in the same dtype (bfloat16 by default: exactly, except
inside score ties).

``gpu`` test. ``benchmarks/gpu_serving.sh`` runs the same command at the issue's shape
(qwen2-0.5b, prompt 1024, beam 256, 1M items)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import child_env
from xgr_common.tolerances import RANKED_LIST_RULE

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "torch_call_cache"

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                 reason="the export and its check run TensorFlow")]


HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cuda_export(tmp_path_factory):
    """``xgr export`` for cuda:0 with --verify_requests, and its report."""
    tmp_path = tmp_path_factory.mktemp("cuda_export")
    report = tmp_path / "report.json"
    env = child_env(TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-m", "xgr_cli.main", "export", f"--out={tmp_path / 'recs' / '1'}",
         "--device=cuda:0", "--num_items=2000", "--num_users=16", "--history_events=60",
         "--keep_last=40", "--window_days=3650", "--beam_width=32", "--top_k=24", "--top_n=16",
         "--max_batch=64", "--verify_requests=8", f"--report_json={report}",
         f"--cache_dir={CACHE}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-4000:])
    return tmp_path / "recs" / "1", json.loads(report.read_text())


def test_cuda_export_matches_the_python_pipeline_on_the_gpu(cuda_export):
    _, result = cuda_export
    verify = result["verify"]
    # bfloat16, the CUDA default: items exact except inside score ties (the ranked-list rule).
    assert verify["ok"] and verify["requests"] == 8
    assert verify["rows_exact"] + verify["rows_within_ties"] == 8
    assert verify["dtype"] == "bfloat16" and verify["rule"] == RANKED_LIST_RULE
    assert not verify["forbidden_modules"]
    assert result["device"] == "cuda:0" and result["dtype"] == "bfloat16"
    assert verify["prompt_tokens_max"] == 4 + 4 * 40   # full prompts: the history is long
    assert min(verify["items_per_request"]) == 16      # the history rule ran on the device
    # What Engine.recommend runs on CUDA: the fused selection kernels inside the package,
    # which TorchCall replays per bucket; the layer left to Inductor unless asked for.
    assert result["selection_backend"] == "triton" and result["layer_kernels"] is False
    assert "graphs " in result["engine_signature"] and "bucket 0 0 pow2" in result[
        "engine_signature"]


def _signature_sizes(signature: str) -> tuple[int, int, int]:
    """(soft tokens, hidden, max_position) from the package's contract lines."""
    embeds = next(line for line in signature.splitlines()
                  if line.startswith("in float32")).split()
    rule = next(line for line in signature.splitlines() if line.startswith("rule positions"))
    max_position = int(rule.split("max_position=")[1].split(":")[0])
    return int(embeds[-2]), int(embeds[-1]), max_position


def test_cuda_package_replays_one_graph_per_call_and_refuses_hostile_values(cuda_export):
    """Out-of-range tokens, bad lengths and segments, NaN embeddings and a prompt past the
    model's positions are InvalidArgument before any kernel runs (a device-side assert would
    poison the context for every later request); the next request is answered as before;
    every valid call is one graph replay, captured without a host synchronisation."""
    saved_model, result = cuda_export
    soft, hidden, max_position = _signature_sizes(result["engine_signature"])
    done = subprocess.run([sys.executable, str(HERE / "hostile_child.py"),
                           str(saved_model / "assets" / "engine.pt2"), str(hidden), str(soft),
                           str(max_position)], cwd=ROOT,
                          env=child_env(TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(out["cases"].values()) == {"InvalidArgumentError"}, out
    assert "prompt_past_max_position" in out["cases"] and out["next_request_equal"]
    stats = out["stats"]
    assert stats["graphs"] and stats["failure"] == "" and stats["eager_runs"] == 0, stats
    assert stats["calls"] == 2 and stats["replays"] == 2 and stats["captures"] == 1, stats


def test_random_hostile_requests_never_fault_the_cuda_package(cuda_export, tmp_path):
    """The fuzz suite's TorchCall surface on the CUDA package: random valid and broken
    requests (values, dtypes, shapes, row counts; many prompt and batch buckets, so graphs are
    captured, replayed and evicted) are answered or refused InvalidArgument, never a fault or
    an abort, and a later valid request is answered as before."""
    saved_model, result = cuda_export
    signature = tmp_path / "engine_signature.txt"
    signature.write_text(result["engine_signature"])
    check = f"torch_call:{saved_model / 'assets' / 'engine.pt2'}:{signature}"
    done = subprocess.run([sys.executable, "-W", "ignore", str(HERE.parent / "fuzz_suite.py"),
                           check], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env=child_env(TF_CPP_MIN_LOG_LEVEL="3", XGR_FUZZ_EXAMPLES="150"))
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:])
    assert "surface torch_call cases=150" in done.stdout, done.stdout
