"""One SavedModel: the real feature graph, TorchCall on an engine package, TF post-processing;
reloaded in a fresh process without torch_engine or Python torch, it returns exactly the items
of the in-process Python pipeline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import torch

from bridge.pipeline import RecommendPipeline
from tests.child_env import child_env
from tf_frontend.feature_graph import INPUTS, FeatureGraph, features_from_world
from tf_frontend.pipeline_spec import OUTPUTS, PipelineConfig
from tf_frontend.rules import PostProcessor
from xgr_common.errors import ExportError
from xgr_common.prompt_spec import PromptSpec
from xgr_common.serving_names import SERVING_SIGNATURE
from xgr_export.saved_model import export_pipeline
from xgr_world.synthetic import make_world

# Heavy (SavedModel exports reloaded in fresh processes): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

HERE = Path(__file__).resolve().parent
TOY_INPUTS = ("token_ids", "lengths")
CONFIG = PipelineConfig(top_n=4)


@pytest.fixture(scope="module")
def world(builder):
    return make_world(builder.WORLD)


@pytest.fixture(scope="module")
def feature_graph(world):
    return FeatureGraph(PromptSpec(), world.item_ids, world.item_codes, seed=3)


@pytest.fixture(scope="module")
def saved_model(packages, feature_graph, tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline") / "saved_model"
    return export_pipeline(out, feature_graph, packages["recommender"], CONFIG, TOY_INPUTS)


@pytest.fixture(scope="module")
def features(world):
    return features_from_world(world, slice(0, 12))


def _reload_in_fresh_process(saved_model: Path, features: dict, tmp_path: Path) -> dict:
    feats = tmp_path / "features.npz"
    arrays = {name: value.numpy() for name, value in features.items()}
    arrays["country"] = arrays["country"].astype("S")  # loadable without pickle
    np.savez(feats, **arrays)
    out = tmp_path / "outputs.npz"
    env = child_env(TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, str(HERE / "reload_child.py"), str(saved_model),
                           str(feats), str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out, allow_pickle=True) as data:
        return {name: data[name] for name in data.files}


def test_signature_names_every_input_and_output(saved_model):
    serve = tf.saved_model.load(str(saved_model)).signatures[SERVING_SIGNATURE]
    assert set(serve.structured_input_signature[1]) == set(INPUTS)
    assert set(serve.structured_outputs) == set(OUTPUTS)
    assert (saved_model / "assets" / "recommender.pt").exists()


def test_fresh_process_matches_the_python_pipeline(saved_model, feature_graph, features,
                                                   builder, tmp_path):
    toy = builder.ToyRecommender().eval()
    with torch.no_grad():
        want = RecommendPipeline(feature_graph, toy, CONFIG, TOY_INPUTS)(features)
    got = _reload_in_fresh_process(saved_model, features, tmp_path)
    modules = set(got.pop("modules").tolist())
    assert "torch" not in modules and not any(m.startswith("torch.") for m in modules)
    assert not {"torch_engine.engine", "torch_engine.model", "tf_frontend"} & modules
    np.testing.assert_array_equal(got["item_ids"], want["item_ids"].numpy())
    np.testing.assert_array_equal(got["num_items"], want["num_items"].numpy())
    np.testing.assert_allclose(got["scores"], want["scores"].numpy(), rtol=1e-5, atol=1e-5)
    assert (got["num_items"] > 0).all()


def test_moved_saved_model_still_finds_its_package(saved_model, features, tmp_path):
    moved = tmp_path / "elsewhere"
    subprocess.run(["cp", "-r", str(saved_model), str(moved)], check=True)
    got = _reload_in_fresh_process(moved, features, tmp_path)
    assert got["item_ids"].shape == (12, CONFIG.top_n)


def test_post_process_drops_padding_and_seen_items():
    item_ids = tf.constant([[5, 7, -1, 9], [3, 4, 6, 8]], tf.int64)
    scores = tf.constant([[-1.0, -2.0, -np.inf, -3.0], [-1.0, -1.5, -2.0, -2.5]])
    seen = tf.constant([[7, -1], [4, 8]], tf.int64)
    out = PostProcessor(top_n=3)(item_ids, scores, seen)
    np.testing.assert_array_equal(out["item_ids"].numpy(), [[5, 9, -1], [3, 6, -1]])
    np.testing.assert_array_equal(out["num_items"].numpy(), [2, 2])
    np.testing.assert_array_equal(out["scores"].numpy(), [[-1.0, -3.0, -np.inf],
                                                          [-1.0, -2.0, -np.inf]])


def test_export_refuses_a_non_empty_folder_and_a_mismatched_package(packages, feature_graph,
                                                                   tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    with pytest.raises(ExportError, match="not empty"):
        export_pipeline(tmp_path / "taken", feature_graph, packages["recommender"],
                        CONFIG, TOY_INPUTS)
    with pytest.raises(ExportError, match="package takes 2 inputs"):
        export_pipeline(tmp_path / "new", feature_graph, packages["recommender"], CONFIG)
    with pytest.raises(ExportError, match="must return \\(item_ids int64, scores float32\\)"):
        export_pipeline(tmp_path / "new", feature_graph, packages["two_heads_aoti"], CONFIG,
                        TOY_INPUTS)


def test_python_only_custom_ops_are_refused_at_export(packages):
    message = packages["refusals"]["python_custom_op"]
    assert "xgr_test::scale" in message and "torch.library.triton_op" in message


def test_export_tells_the_server_the_ragged_inputs_and_history_limit(saved_model):
    from tf_frontend.serving.signature import SERVING_SPEC_FILE, ServingSpec

    spec = ServingSpec.read(str(saved_model))
    assert (saved_model / SERVING_SPEC_FILE).is_file()
    assert spec.max_history_events == CONFIG.max_history_events
    assert set(spec.ragged["history_splits"]) == {"history_items", "history_times"}


EXCLUDER_INPUTS = ("token_ids", "lengths", "exclude_items")


def test_the_engine_gets_the_history_and_lists_stay_full(packages, feature_graph, features,
                                                         builder, tmp_path):
    """The history rule runs on the device (``exclude_items``): the reloaded SavedModel matches
    the Python pipeline, never returns a history item, and fills every list to top_n."""
    saved = export_pipeline(tmp_path / "excluding", feature_graph, packages["excluder"], CONFIG,
                            EXCLUDER_INPUTS)
    with torch.no_grad():
        want = RecommendPipeline(feature_graph, builder.ToyExcluder().eval(), CONFIG,
                                 EXCLUDER_INPUTS)(features)
    got = _reload_in_fresh_process(saved, features, tmp_path)
    np.testing.assert_array_equal(got["item_ids"], want["item_ids"].numpy())
    np.testing.assert_allclose(got["scores"], want["scores"].numpy(), rtol=1e-5, atol=1e-5)
    cleaned = feature_graph(features)
    history = tf.RaggedTensor.from_row_splits(cleaned["history_values"],
                                              cleaned["history_splits"]).to_list()
    assert any(history)
    for row, seen in zip(got["item_ids"], history):
        assert not set(row.tolist()) & set(seen)
    assert (got["num_items"] == CONFIG.top_n).all()
    # Without the rule the toy engine does return history items: the rule is doing the work.
    with torch.no_grad():
        plain = builder.ToyRecommender().eval()
        out = feature_graph(features)
        raw, _ = plain(torch.from_numpy(out["token_ids"].numpy()),
                       torch.from_numpy(out["lengths"].numpy()))
    assert any(set(row.tolist()) & set(seen) for row, seen in zip(raw, history))
