"""benchmarks/load_serving.py as a user runs it, on the feature-graph SavedModel, tiny counts:
it must finish with every valid request answered with its own results and every malformed one
refused, and write its JSON."""

import json
import os
import subprocess
import sys

import pytest

from tests.child_env import child_env

# Heavy (the load benchmark against a served model): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytest.importorskip("custom_ops")


def test_load_benchmark_small_run(tmp_path):
    from tf_frontend.feature_graph import FeatureGraph
    from tf_frontend.saved_model import export_feature_graph
    from xgr_common.prompt_spec import PromptSpec
    from xgr_world.synthetic import WorldConfig, make_world

    world = make_world(WorldConfig(num_items=300, num_users=40))  # the benchmark's world
    export_feature_graph(FeatureGraph(PromptSpec(), world.item_ids, world.item_codes, seed=2),
                         tmp_path / "features" / "1")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.load_serving",
         f"--model_base_path={tmp_path / 'features'}", "--requests=80", "--clients=4",
         "--warmup_requests=2", "--malformed_share=0.25", "--rates=20", "--rate_fractions=0.05",
         "--rate_seconds=1",
         f"--out_dir={tmp_path / 'out'}", "--label=test", "--model_label=feature graph",
         f"--server_log={tmp_path / 'server.log'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=child_env(TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 0, done.stderr[-3000:]
    (result_file,) = (tmp_path / "out").iterdir()
    result = json.loads(result_file.read_text())
    assert result["sent"] == 80 and result["valid_ok"] == result["valid"] > 0
    assert result["malformed_refused_400"] == result["malformed"] > 0
    # Malformed requests go over both protocols; nothing is shed or lost at this load.
    assert 0 < result["malformed_grpc"] < result["malformed"]
    assert result["valid_shed_503"] == result["valid_lost"] == 0
    # No nvidia-smi here: no GPU figure, rather than a made-up one.
    assert result["gpu"] is None or result["gpu"]["samples"] > 0
    assert result["model_calls"] >= 1 and result["mean_rows_per_model_call"] >= 2
    assert result["valid_answered_with_another_requests_results"] == 0
    # --rate_fractions sizes a rate from the closed loop's throughput; rates run in order.
    offered = [run["offered_rps"] for run in result["open_loop"]]
    fraction = round(0.05 * result["throughput_rps"], 1)
    assert sorted({20.0, fraction}) == offered
    assert result["open_loop"][offered.index(20.0)]["sent"] == 20
    assert result["server_exit_code_after_sigterm"] == 0
    # The server's own record of the stop, beside the figures.
    logs = [json.loads(x) for x in (tmp_path / "server.log").read_text().splitlines()
            if x.startswith("{")]
    assert [e["message"] for e in logs][-2:] == ["shutting down", "stopped"]
