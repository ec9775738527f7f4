"""A version 2 model through ``xgr export`` as a team would give it: the card says prompt
version 2, so the SavedModel holds the version 2 feature graph (the history split, the SOFT
markers) and an engine package that places the profile vectors at the markers; reloaded in a
fresh process it answers like the in-process pipeline of the same card.

The fit here was trained in version 1; only the plumbing is under test (the same weights
under the other prompt give other, equally valid lists)."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest

from tests.pipeline.conftest import export_team_files
from tf_frontend.feature_graph import features_from_world
from xgr_common.model_card import ModelCard
from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout, TextSpans
from xgr_export.verify import run_fresh

# Heavy (an AOTInductor compile of the fitted model, fresh processes).
pytestmark = pytest.mark.heavy

BEAMS, TOP_K, TOP_N = 16, 12, 8


@pytest.fixture(scope="module")
def v2_export(quick_model, xgr, tmp_path_factory):
    folder = tmp_path_factory.mktemp("v2_export")
    files = quick_model.export_files()
    model = shutil.copytree(files["model"], folder / "model")
    card = ModelCard.read(model)
    spec = replace(card.spec, prompt_v2=PromptV2Layout(
        HistorySplit(block_seconds=7 * 86400, long_term_blocks=8, long_term_items=20,
                     recent_items=10), TextSpans(question=(card.spec.layout.bos_id,))))
    replace(card, spec=spec).write(model)
    out = folder / "saved_model"
    done, report = export_team_files(xgr, out, {**files, "model": model}, BEAMS, TOP_K, TOP_N,
                                     "--verify_requests=8")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-4000:])
    return out, report, spec


def test_the_export_reports_version_2_and_verifies(v2_export):
    _, report, spec = v2_export
    assert report["prompt_version"] == 2
    assert report["max_prompt_tokens"] == spec.max_prompt_tokens
    verify = report["verify"]
    assert verify["ok"] and verify["requests"] == 8


def test_the_reloaded_saved_model_serves_lists(v2_export, quick_model):
    out = v2_export[0]
    features = features_from_world(quick_model.world, quick_model.settings.eval_users[:6])
    got = run_fresh(out, features)
    assert got["item_ids"].shape == (6, TOP_N) and (got["num_items"] > 0).all()
    assert not {m for m in got["modules"].tolist() if m.split(".")[0] == "torch"}
    # The seen items never come back (the history exclusions of both parts).
    world = quick_model.world
    for row, user in enumerate(quick_model.settings.eval_users[:6]):
        seen = set(world.history_items[world.history_splits[user]:
                                       world.history_splits[user + 1]].tolist())
        assert not seen & set(got["item_ids"][row][got["item_ids"][row] >= 0].tolist())
