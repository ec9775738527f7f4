"""The demo round trip in prompt version 2: the quick world fitted on the version 2 prompt,
its checkpoint, card, catalog and trained feature graph through ``xgr export`` as a team's
files; the SavedModel (the version 2 feature graph with its SOFT markers, an engine package
that places the profile vectors there), verified against the in-process pipeline and reloaded
in a fresh process with TF + custom_ops alone, returns the in-process pipeline's items."""

from __future__ import annotations

import numpy as np
import pytest

from tests.pipeline.conftest import export_team_files
from tf_frontend.feature_graph import features_from_world
from xgr_common.layout import MaskMode
from xgr_export.verify import run_fresh

# Heavy (a fit, an AOTInductor compile of the fitted model, fresh processes).
pytestmark = pytest.mark.heavy

BEAMS, TOP_K, TOP_N, USERS = 16, 12, 8, 12


@pytest.fixture(scope="module")
def v2_model(tmp_path_factory):
    from xgr_world import default_model as dm

    settings = dm.with_prompt_version(dm.QUICK, 2)
    return dm.fit_or_load(settings, tmp_path_factory.mktemp("v2_fit"), progress=False)


@pytest.fixture(scope="module")
def v2_export(v2_model, xgr, tmp_path_factory):
    out = tmp_path_factory.mktemp("v2_export") / "saved_model"
    done, report = export_team_files(xgr, out, v2_model.export_files(), BEAMS, TOP_K, TOP_N,
                                     "--verify_requests=8")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-4000:])
    return out, report


def test_the_card_and_the_export_are_version_2(v2_model, v2_export):
    from xgr_common.model_card import ModelCard

    card = ModelCard.read(v2_model.export_files()["model"])
    assert card.spec.version == 2 and card.spec == v2_model.settings.spec
    report = v2_export[1]
    assert report["prompt_version"] == 2 and report["prefill_mask"] == "causal"
    assert report["max_prompt_tokens"] == card.spec.max_prompt_tokens
    assert report["verify"]["ok"] and report["verify"]["requests"] == 8


def test_the_reloaded_saved_model_returns_the_pipelines_items(v2_model, v2_export):
    from bridge.pipeline import RecommendPipeline
    from tf_frontend.pipeline_spec import PipelineConfig
    from torch_engine.catalog import Catalog
    from torch_engine.config import engine_config_for
    from torch_engine.engine import Engine

    world, spec = v2_model.world, v2_model.settings.spec
    users = v2_model.settings.eval_users[:USERS]
    features = features_from_world(world, users)
    got = run_fresh(v2_export[0], features)
    engine = Engine(v2_model.model, Catalog.from_arrays(world.item_ids, world.item_codes,
                                                        spec.layout), engine_config_for(spec))
    pipeline = RecommendPipeline.for_engine(
        v2_model.feature_graph(), engine, BEAMS, TOP_K, PipelineConfig(top_n=TOP_K),
        catalog=(world.item_ids, world.item_codes), prefill_mask=MaskMode.CAUSAL)
    want = pipeline(features)
    np.testing.assert_array_equal(got["item_ids"], want["item_ids"].numpy()[:, :TOP_N])
    assert (got["num_items"] > 0).all()
    assert not {m for m in got["modules"].tolist() if m.split(".")[0] == "torch"}
    # The history of both parts is excluded: no seen item comes back.
    for row, user in enumerate(users):
        seen = set(world.history_items[world.history_splits[user]:
                                       world.history_splits[user + 1]].tolist())
        assert not seen & set(got["item_ids"][row][got["item_ids"][row] >= 0].tolist())
