"""The demo round trip: the model ``xgr demo`` fits (causal mask), its catalog file and its
trained feature graph go through ``xgr export`` as a team's files would; the SavedModel,
reloaded in a fresh process with TF + custom_ops alone, returns the demo's items for the
demo's held-out users. A feature graph given as a SavedModel folder exports the same way."""

from __future__ import annotations

import numpy as np
import pytest

from tests.pipeline.conftest import export_team_files
from tf_frontend.feature_graph import features_from_world
from xgr_common.layout import MaskMode
from xgr_export.feature_graphs import save_feature_graph
from xgr_export.verify import compare, run_fresh

# Heavy (AOTInductor compiles of the fitted model, fresh processes).
pytestmark = pytest.mark.heavy

BEAMS, TOP_K, TOP_N, USERS = 32, 20, 10, 24


def _export(xgr, out, files: dict, *extra: str):
    done, report = export_team_files(xgr, out, files, BEAMS, TOP_K, TOP_N, *extra)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-4000:])
    return done.stdout, report


@pytest.fixture(scope="module")
def demo_export(quick_model, xgr, tmp_path_factory):
    out = tmp_path_factory.mktemp("demo_export") / "saved_model"
    return (out, *_export(xgr, out, quick_model.export_files(), "--verify_requests=16"))


def test_the_fit_folder_holds_a_teams_files(quick_model):
    from xgr_common.model_card import ModelCard

    files = quick_model.export_files()
    card = ModelCard.read(files["model"])
    assert card.prefill_mask is quick_model.settings.train.mask_mode is MaskMode.CAUSAL
    assert card.spec == quick_model.settings.spec
    assert files["catalog"].is_file() and files["feature_graph"].is_file()


def test_export_takes_the_cards_mask_and_verifies(demo_export):
    _, stdout, report = demo_export
    assert report["prefill_mask"] == "causal" and report["dtype"] == "float32"
    assert report["catalog"].endswith("catalog.parquet")
    verify = report["verify"]
    assert verify["ok"] and verify["requests"] == 16 and verify["rows_exact"] == 16
    assert "the Python pipeline (Engine.recommend in float32)" in stdout


def test_reloaded_saved_model_returns_the_demos_items(demo_export, quick_model, make_pipeline):
    out = demo_export[0]
    users = quick_model.settings.eval_users[:USERS]
    features = features_from_world(quick_model.world, users)
    got = run_fresh(out, features)
    demo = make_pipeline(BEAMS, TOP_K, prefill_mask=MaskMode.CAUSAL)
    want = demo(features)
    # The demo's lists cut to the export's top_n: the same rules, the same order.
    np.testing.assert_array_equal(got["item_ids"], want["item_ids"].numpy()[:, :TOP_N])
    assert (got["num_items"] > 0).all()
    assert not {m for m in got["modules"].tolist() if m.split(".")[0] == "torch"}


def test_the_item_causal_mask_would_give_other_items(demo_export, quick_model, make_pipeline):
    """The control: the mask matters, so exporting with the card's mask is what matched."""
    users = quick_model.settings.eval_users[:USERS]
    features = features_from_world(quick_model.world, users)
    causal = make_pipeline(BEAMS, TOP_K, prefill_mask=MaskMode.CAUSAL)(features)
    item_causal = make_pipeline(BEAMS, TOP_K, prefill_mask=MaskMode.ITEM_CAUSAL)(features)
    assert not np.array_equal(causal["item_ids"].numpy(), item_causal["item_ids"].numpy())


def test_a_saved_model_feature_graph_exports_the_same_items(demo_export, quick_model, xgr,
                                                            tmp_path, monkeypatch):
    folder = save_feature_graph(quick_model.feature_graph(), tmp_path / "feature_graph")
    files = {**quick_model.export_files(), "feature_graph": folder}
    out = tmp_path / "saved_model"
    _, report = _export(xgr, out, files, "--verify_requests=8")
    assert report["verify"]["ok"] and report["feature_graph"] == str(folder)
    features = features_from_world(quick_model.world, quick_model.settings.eval_users[:8])
    first = run_fresh(demo_export[0], features)
    second = run_fresh(out, features)
    assert compare(second, first).ok
    # A path relative to the caller's folder (the fresh process starts elsewhere).
    monkeypatch.chdir(tmp_path)
    assert compare(run_fresh("saved_model", features), first).ok
