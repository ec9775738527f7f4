"""Per-request controls through the exported SavedModel's ``serving_with_controls``: each
request's own ``exclude_items`` join its history on the device, so no excluded item comes back
and the list stays full, and its own ``top_k`` cuts its list; the result equals the in-process
pipeline over ``Engine.recommend`` given the same controls, and bad controls are refused
naming the input and the rule. The export is the session's one (``tests/tiny_export.py``)."""

from __future__ import annotations


import numpy as np
import pytest

from bridge.pipeline import RecommendPipeline
from tests.tiny_export import BEAMS, ITEMS, SEED, TOP_K, TOP_N, served
from tf_frontend.feature_graph import FeatureGraph, features_from_world
from tf_frontend.pipeline_spec import PipelineConfig
from torch_engine.catalog import Catalog
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_common.prompt_spec import PromptSpec
from xgr_common.serving_names import CONTROLS_SIGNATURE, SERVING_SIGNATURE
from xgr_world.synthetic import WorldConfig, make_world

MAX_EXCLUSIONS = 256   # xgr export's default --max_request_exclusions

pytestmark = [pytest.mark.slow, pytest.mark.heavy]


def _controls(rows: list[list[int]], top_k: list[int] | None = None) -> dict:
    splits = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    return {"exclude_items": np.array([x for r in rows for x in r], np.int64),
            "exclude_splits": splits,
            "top_k": np.array(top_k if top_k is not None else [TOP_K] * len(rows), np.int32)}


def test_each_requests_exclusions_are_applied_on_the_device(tiny_engine_export, tmp_path):
    saved_model = tiny_engine_export[0]
    world = make_world(WorldConfig(num_items=ITEMS, seed=SEED))
    features = features_from_world(world, slice(0, 6))
    plain = served(saved_model, features, tmp_path, "plain", SERVING_SIGNATURE)
    top = plain["item_ids"]
    rows = [top[0, :3].tolist(),             # the three best items of its own list
            [],                              # nothing: its list is unchanged
            [10**12],                        # an id no catalog holds: harmless
            top[3, :TOP_N].tolist(),         # its whole list
            top[0, :3].tolist(),             # another request's best items
            list(range(1, 40))]              # many ids, most outside its list
    top_k = [TOP_K, 3, TOP_K, TOP_K, TOP_K, 1]   # rows 1 and 5 ask for shorter lists
    controls = _controls(rows, top_k)
    got = served(saved_model, {**features, **controls}, tmp_path, "controlled",
                  CONTROLS_SIGNATURE)
    assert "error" not in got

    for row, excluded in enumerate(rows):
        returned = got["item_ids"][row][got["item_ids"][row] >= 0].tolist()
        assert not set(returned) & set(excluded), f"request {row} got an excluded item back"
        assert got["num_items"][row] == min(TOP_N, top_k[row]), f"request {row}'s list is short"
    # No exclusions, top_k 3: the first three of its plain list.
    np.testing.assert_array_equal(got["item_ids"][1][:3], top[1][:3])
    assert (got["item_ids"][1][3:] == -1).all()
    np.testing.assert_array_equal(got["item_ids"][2], top[2])
    assert not np.array_equal(got["item_ids"][0], top[0])

    model = Model.from_preset("tiny", seed=SEED)
    engine = Engine(model, Catalog.from_arrays(world.item_ids, world.item_codes))
    graph = FeatureGraph(PromptSpec(model_hidden=model.config.hidden_size), world.item_ids,
                         world.item_codes, seed=SEED)
    want = RecommendPipeline.for_engine(
        graph, engine, BEAMS, TOP_K,
        PipelineConfig(top_n=TOP_N, max_request_exclusions=MAX_EXCLUSIONS))(
            {**features, **{k: np.asarray(v) for k, v in controls.items()}})
    np.testing.assert_array_equal(got["item_ids"], want["item_ids"].numpy())
    np.testing.assert_array_equal(got["num_items"], want["num_items"].numpy())


@pytest.mark.parametrize("rows, top_k, rule", [
    ([list(range(MAX_EXCLUSIONS + 1)), []], None,
     f"exclude_items: a request may exclude at most {MAX_EXCLUSIONS} items"),
    ([[5, -3], []], None, "exclude_items must be item ids >= 0"),
    ([[], []], [0, 2], "top_k must be >= 1"),
    ([[], []], [2, TOP_K + 1], "top_k must not exceed the top_k of the export"),
])
def test_bad_controls_are_refused_naming_the_rule(tiny_engine_export, tmp_path, rows, top_k,
                                                  rule):
    world = make_world(WorldConfig(num_items=ITEMS, seed=SEED))
    features = features_from_world(world, slice(0, 2))
    got = served(tiny_engine_export[0], {**features, **_controls(rows, top_k)}, tmp_path,
                  "bad", CONTROLS_SIGNATURE)
    assert "error" in got and rule in str(got["error"])
