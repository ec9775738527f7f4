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


def test_cuda_export_matches_the_python_pipeline_on_the_gpu(tmp_path):
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
    result = json.loads(report.read_text())
    verify = result["verify"]
    # bfloat16, the CUDA default: items exact except inside score ties (the ranked-list rule).
    assert verify["ok"] and verify["requests"] == 8
    assert verify["rows_exact"] + verify["rows_within_ties"] == 8
    assert verify["dtype"] == "bfloat16" and verify["rule"] == RANKED_LIST_RULE
    assert not verify["forbidden_modules"]
    assert result["device"] == "cuda:0" and result["dtype"] == "bfloat16"
    assert verify["prompt_tokens_max"] == 4 + 4 * 40   # full prompts: the history is long
    assert min(verify["items_per_request"]) == 16      # the history rule ran on the device
