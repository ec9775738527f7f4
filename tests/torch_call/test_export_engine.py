"""``xgr export`` on the real engine: torch.export + AOTInductor of Engine.recommend inside the
pipeline SavedModel; reloaded in a fresh process (TF + custom_ops only) it returns exactly the
items of the in-process Python pipeline (feature graph -> DLPack -> Engine.recommend).

The export is the session's one (``tests/tiny_export.py``): its first run compiles the engine
(~2 min on 2 cores); later runs reuse ``build/serving_example_cache``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bridge.pipeline import RecommendPipeline
from tests.child_env import child_env
from tests.tiny_export import (BEAMS, ITEMS, MAX_BATCH, SEED, TOP_K, TOP_N, VERIFIED,
                               run_python)
from tf_frontend.feature_graph import FeatureGraph, features_from_world
from tf_frontend.pipeline_spec import PipelineConfig
from torch_engine.catalog import Catalog
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_common.prompt_spec import PromptSpec
from xgr_common.tolerances import TOLERANCES
from xgr_common.value_rules import HOST_RULES, VALUE_RULES
from xgr_world.synthetic import WorldConfig, make_world

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# Heavy (an AOTInductor export of the engine and fresh processes): left out of `make test-quick`.
pytestmark = [pytest.mark.slow, pytest.mark.heavy]
_run = run_python


@pytest.fixture(scope="module")
def exported(tiny_engine_export):
    """(SavedModel folder, stdout, JSON report) of one `xgr export --verify_requests`."""
    return tiny_engine_export


@pytest.fixture(scope="module")
def saved_model(exported):
    return exported[0]


def test_export_verifies_its_saved_model_in_a_fresh_process(exported):
    out, stdout, report = exported
    assert f"saved {out}" in stdout
    assert f"verify: {VERIFIED} requests" in stdout and "items equal" in stdout
    verify = report["verify"]
    assert verify["ok"] and verify["rows_exact"] == verify["requests"] == VERIFIED
    assert verify["num_items_exact"] and not verify["forbidden_modules"]
    assert report["top_n"] == TOP_N and report["saved_model"] == str(out)
    # The server learns the engine's largest batch from the export: no request carries more.
    serving = json.loads((out / "assets.extra" / "xgr_serving.json").read_text())
    assert serving["max_rows"] == MAX_BATCH
    assert len(verify["items_per_request"]) == VERIFIED
    # The package's contract records the value rules of its inputs, in flag order, and the
    # op that ran the fresh-process check parsed it.
    contract = report["engine_signature"].splitlines()
    rules = [line for line in contract if line.startswith("rule ")]
    assert [line.split()[1] for line in rules] == [rule.name for rule in
                                                   (*VALUE_RULES, *HOST_RULES)]
    token_range = next(line for line in rules if line.split()[1] == "token_range")
    assert "tokens=0 lengths=1 vocab=1024:" in token_range


def test_reloaded_engine_pipeline_matches_python_pipeline(saved_model, tmp_path):
    world = make_world(WorldConfig(num_items=ITEMS, seed=SEED))
    features = features_from_world(world, slice(0, 8))
    feats = tmp_path / "features.npz"
    arrays = {name: value.numpy() for name, value in features.items()}
    arrays["country"] = arrays["country"].astype("S")
    np.savez(feats, **arrays)
    _run([str(HERE / "reload_child.py"), str(saved_model), str(feats), str(tmp_path / "o.npz")],
         timeout=300)
    with np.load(tmp_path / "o.npz", allow_pickle=True) as data:
        got = {name: data[name] for name in data.files}
    modules = set(got["modules"].tolist())
    assert "torch" not in modules and "torch_engine.engine" not in modules

    model = Model.from_preset("tiny", seed=SEED)
    engine = Engine(model, Catalog.from_arrays(world.item_ids, world.item_codes))
    spec = PromptSpec(model_hidden=model.config.hidden_size)
    graph = FeatureGraph(spec, world.item_ids, world.item_codes, seed=SEED)

    want = RecommendPipeline.for_engine(graph, engine, BEAMS, TOP_K,
                                        PipelineConfig(top_n=TOP_N))(features)
    np.testing.assert_array_equal(got["item_ids"], want["item_ids"].numpy())
    np.testing.assert_array_equal(got["num_items"], want["num_items"].numpy())
    tol = TOLERANCES["float32"]
    finite = np.isfinite(got["scores"])
    np.testing.assert_allclose(got["scores"][finite], want["scores"].numpy()[finite],
                               atol=tol.atol * 10, rtol=tol.rtol)
    assert (got["num_items"] > 0).all()


def test_export_rejects_sizes_the_search_cannot_serve(tmp_path):
    env = child_env(TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-m", "xgr_cli.main", "export",
                           f"--out={tmp_path / 'never'}", f"--num_items={ITEMS}",
                           "--beam_width=4", "--top_k=50"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "top_k 50 exceeds the 4 items beam_width 4 can reach" in done.stderr
    assert not (tmp_path / "never").exists()


def test_engine_package_refuses_mismatched_prompt_widths(saved_model):
    import tensorflow as tf

    from custom_ops.torch_call import torch_call

    engine = str(saved_model / "assets" / "engine.pt2")
    tokens = np.full((2, 6), 1, np.int32)
    lengths = np.array([6, 4], np.int32)
    embeds = np.zeros((2, PromptSpec().profile_tokens, 64), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 2 dim 1 .*must match"):
        torch_call(engine, [tokens, lengths, np.zeros((2, 5), np.int32), embeds,
                            np.full((2, 1), -1, np.int64)], [tf.int64, tf.float32])
    exclude = np.full((2, 1), -1, np.int64)
    item_ids, scores = torch_call(engine, [tokens, lengths, np.zeros((2, 6), np.int32), embeds,
                                           exclude], [tf.int64, tf.float32])
    assert item_ids.shape == (2, TOP_K) and scores.dtype == tf.float32


def test_hostile_values_are_refused_by_the_packages_own_rules(exported):
    """Each value that breaks a rule (a prompt longer than the model's positions too) is
    answered InvalidArgument before any kernel runs, the process survives all of them, and
    the next request is answered as before."""
    saved_model, _, report = exported
    engine = saved_model / "assets" / "engine.pt2"
    rule = next(line for line in report["engine_signature"].splitlines()
                if line.startswith("rule positions"))
    max_position = rule.split("max_position=")[1].split(":")[0]
    done = _run([str(HERE / "hostile_child.py"), str(engine), "64",
                 str(PromptSpec().profile_tokens), max_position], timeout=300)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["cases"] and set(result["cases"].values()) == {"InvalidArgumentError"}, result
    assert "prompt_past_max_position" in result["cases"] and result["next_request_equal"]


def test_the_export_writes_warm_up_requests_a_server_replays(saved_model):
    """``assets.extra/tf_serving_warmup_requests``: the export's probe requests in TF
    Serving's format, replayed before the version serves (its engine package loads then)."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = saved_model / "assets.extra" / "tf_serving_warmup_requests"
    logs = []
    for record in tf.data.TFRecordDataset(str(path)):
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(record.numpy())
        logs.append(log)
    assert logs and all(log.WhichOneof("log_type") == "predict_log" for log in logs)
    assert {"history_items", "history_splits"} <= set(logs[0].predict_log.request.inputs)
