"""The in-process pipeline on the quick model: valid items, rules, determinism, batching.

That it returns what a reloaded SavedModel returns, item for item, is tested where SavedModels
are exported (``tests/torch_call/test_pipeline.py``, ``test_export_engine.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from bridge.pipeline import EngineSearch, RecommendPipeline
from tf_frontend.feature_graph import features_from_world
from tf_frontend.pipeline_spec import PipelineConfig
from tf_frontend.rules import BusinessRules, PostProcessor
from xgr_common.errors import ConfigError, InvalidInputError
from xgr_common.layout import MaskMode
from xgr_common.tolerances import tolerance_for

BEAM, TOP_K = 32, 24


@pytest.fixture(scope="module")
def users(quick_model):
    return quick_model.settings.eval_users[:6]


@pytest.fixture(scope="module")
def pipeline(make_pipeline, quick_model) -> RecommendPipeline:
    """The pipeline as the demo builds it: the mask the quick model was trained with."""
    return make_pipeline(BEAM, TOP_K, prefill_mask=quick_model.settings.train.mask_mode)


def _history(out) -> list[set[int]]:
    ragged = tf.RaggedTensor.from_row_splits(out["history_values"], out["history_splits"])
    return [set(row) for row in ragged.to_list()]


def test_items_exist_are_unseen_and_best_first(pipeline, quick_model, users):
    world = quick_model.world
    out = pipeline(features_from_world(world, users))
    items, scores, count = out["item_ids"].numpy(), out["scores"].numpy(), out["num_items"].numpy()
    assert items.shape == scores.shape == (len(users), TOP_K)
    catalog = set(world.item_ids.tolist())
    for row, seen in enumerate(_history(out)):
        kept = items[row, :count[row]]
        assert count[row] > 0 and set(kept.tolist()) <= catalog
        assert not (set(kept.tolist()) & seen), "an item of the cleaned history came back"
        assert len(set(kept.tolist())) == len(kept)
        assert np.all(np.diff(scores[row, :count[row]]) <= 0)
        assert np.all(items[row, count[row]:] == -1)


def test_same_features_give_identical_results(pipeline, quick_model, users):
    features = features_from_world(quick_model.world, users)
    first = pipeline(features)
    second = pipeline(features)
    np.testing.assert_array_equal(first["item_ids"].numpy(), second["item_ids"].numpy())
    np.testing.assert_array_equal(first["scores"].numpy(), second["scores"].numpy())


def test_batched_equals_one_by_one(pipeline, quick_model, users):
    world = quick_model.world
    batched = pipeline(features_from_world(world, users))
    tol = tolerance_for("float32")
    for row, user in enumerate(users):
        single = pipeline(features_from_world(world, [user]))
        np.testing.assert_array_equal(single["item_ids"].numpy()[0],
                                      batched["item_ids"].numpy()[row])
        np.testing.assert_allclose(single["scores"].numpy()[0], batched["scores"].numpy()[row],
                                   atol=tol.atol, rtol=tol.rtol)


def test_item_causal_pipeline_hands_segment_ids_to_the_engine(make_pipeline, pipeline,
                                                              quick_model, users):
    """The quick model is trained causal; an item-causal pipeline over it must still return
    valid lists, with other scores (the hybrid mask changes the prompt's attention)."""
    features = features_from_world(quick_model.world, users)
    hybrid = make_pipeline(BEAM, TOP_K)(features)        # default: ITEM_CAUSAL
    causal = pipeline(features)
    assert pipeline.recommend.prefill_mask is MaskMode.CAUSAL
    assert not np.array_equal(hybrid["scores"].numpy(), causal["scores"].numpy())
    assert np.all(hybrid["num_items"].numpy() > 0)


def test_rules_drop_blocked_items_and_cap_categories(make_pipeline, quick_model, users):
    world = quick_model.world
    features = features_from_world(world, users)
    plain = make_pipeline(BEAM, TOP_K)(features)["item_ids"].numpy()
    blocked = tuple(int(i) for i in plain[:, 0])                  # everyone's first choice
    ruled = make_pipeline(BEAM, TOP_K, BusinessRules(blocked_items=blocked, max_per_category=3))
    out = ruled(features)
    items, count = out["item_ids"].numpy(), out["num_items"].numpy()
    category = dict(zip(world.item_ids.tolist(), world.item_codes[:, 0].tolist()))
    for row, seen in enumerate(_history(out)):
        kept = items[row, :count[row]].tolist()
        assert not set(kept) & set(blocked)
        assert not set(kept) & seen
        per_category = np.bincount([category[i] for i in kept])
        assert per_category.max() <= 3
        # The survivors keep the engine's order.
        order = [plain[row].tolist().index(i) for i in kept]
        assert order == sorted(order)


def test_lists_are_cut_to_top_n(make_pipeline, quick_model, users):
    """The engine's top_k and the list's top_n are apart: the rules cut to top_n."""
    full = make_pipeline(BEAM, TOP_K)
    short = RecommendPipeline(full.feature_graph, full.recommend, PipelineConfig(top_n=5),
                              device=full.device)
    features = features_from_world(quick_model.world, users)
    want, got = full(features), short(features)
    assert got["item_ids"].shape == (len(users), 5)
    np.testing.assert_array_equal(got["item_ids"].numpy(), want["item_ids"].numpy()[:, :5])
    np.testing.assert_array_equal(got["num_items"].numpy(),
                                  np.minimum(want["num_items"].numpy(), 5))


def test_post_processor_against_a_hand_case(quick_model):
    world = quick_model.world
    ids = world.item_ids
    by_category = {}
    for item, code in zip(ids.tolist(), world.item_codes[:, 0].tolist()):
        by_category.setdefault(code, []).append(item)
    a, b = sorted(by_category)[:2]
    row = [by_category[a][0], by_category[a][1], by_category[b][0], by_category[a][2], -1]
    post = PostProcessor(BusinessRules(blocked_items=(by_category[b][0],), max_per_category=2),
                         None, ids, world.item_codes)
    out = post(tf.constant([row], tf.int64), tf.constant([[-1.0, -2.0, -3.0, -4.0, -np.inf]]))
    assert out["item_ids"].numpy().tolist() == [[row[0], row[1], -1, -1, -1]]
    assert out["scores"].numpy()[0, :2].tolist() == [-1.0, -2.0]
    assert out["num_items"].numpy().tolist() == [2]


def test_timings_cover_every_stage(pipeline, quick_model, users):
    out = pipeline(features_from_world(quick_model.world, users))
    rows = dict(out["timings"].rows())
    assert list(rows) == ["feature_graph", "bridge_in", "engine", "bridge_out", "post_process",
                          "total"]
    assert all(ms >= 0 for ms in rows.values())
    assert rows["total"] == pytest.approx(sum(v for k, v in rows.items() if k != "total"))


def test_features_must_be_a_dict(pipeline, quick_model, users):
    features = features_from_world(quick_model.world, users)
    with pytest.raises(InvalidInputError, match="dict"):
        pipeline(list(features.values()))


def test_a_missing_feature_is_named(pipeline, quick_model, users):
    features = features_from_world(quick_model.world, users)
    with pytest.raises(InvalidInputError, match="request_time"):
        pipeline({k: v for k, v in features.items() if k != "request_time"})


def test_a_top_k_beyond_the_reachable_items_is_refused(make_pipeline, quick_model, users):
    with pytest.raises(InvalidInputError, match="top_k"):
        make_pipeline(4, 10_000)(features_from_world(quick_model.world, users))


def test_bad_rules_and_masks_are_config_errors(pipeline):
    with pytest.raises(ConfigError, match="max_per_category"):
        BusinessRules(max_per_category=0)
    with pytest.raises(ConfigError, match="prefill_mask"):
        EngineSearch(pipeline.recommend.engine, BEAM, TOP_K,
                     prefill_mask=MaskMode.SEGMENT_BIDIRECTIONAL)
    with pytest.raises(ConfigError, match="PipelineConfig"):
        RecommendPipeline(pipeline.feature_graph, pipeline.recommend, config={"top_n": 3})


def test_the_export_checks_wider_reference_searches_wider_and_lists_longer(
        pipeline, quick_model, users):
    """The evidence the 16-bit export check consults for an item its reference's beam
    dropped: the same pipeline at four times the beam, its lists four times longer, and its
    best items those of the narrow search at least."""
    from xgr_export.check import WIDER_BEAM_FACTOR, _wider_reference
    search = pipeline.recommend
    features = features_from_world(quick_model.world, users)
    narrow = pipeline(features)
    wide, run = _wider_reference(pipeline.feature_graph, search.engine, pipeline.config,
                                 features, search.beam_width, search.top_k,
                                 search.prefill_mask)
    assert wide == WIDER_BEAM_FACTOR * search.beam_width
    out = run()
    ids, scores = out["item_ids"].numpy(), out["scores"].numpy()
    assert ids.shape == (len(users), WIDER_BEAM_FACTOR * search.top_k)
    kept = scores[ids >= 0]
    assert np.all(np.diff(scores, axis=1)[(ids[:, 1:] >= 0)] <= 0) and kept.size
    # The wider search finds the narrow one's best item here, or a better one.
    assert np.all(scores[:, 0] >= narrow["scores"].numpy()[:, 0] - 1e-5)


def test_the_export_checks_float32_reference_is_the_16_bit_weights_in_float32(
        quick_model, users):
    """The evidence a failing 16-bit export check takes to say which side drifts: the same
    pipeline on a float32 copy of the 16-bit engine's weights, the engine itself untouched."""
    import copy

    import torch

    from torch_engine.catalog import Catalog
    from torch_engine.config import EngineConfig
    from torch_engine.engine import Engine
    from xgr_export.check import _float32_reference
    world, mask = quick_model.world, quick_model.settings.train.mask_mode
    catalog = Catalog.from_arrays(world.item_ids, world.item_codes,
                                  quick_model.settings.spec.layout)
    half = Engine(copy.deepcopy(quick_model.model), catalog, EngineConfig(dtype="bfloat16"))
    before = next(half.model.parameters()).detach().clone()
    graph, config = quick_model.feature_graph(), PipelineConfig(top_n=TOP_K)
    features = features_from_world(world, users)
    run = _float32_reference(graph, half, config, features, BEAM, TOP_K, mask)
    got = run()
    assert half.dtype == torch.bfloat16 and torch.equal(next(half.model.parameters()), before)
    rounded = copy.deepcopy(quick_model.model).to(torch.bfloat16).to(torch.float32)
    want = RecommendPipeline.for_engine(graph, Engine(rounded, catalog), BEAM, TOP_K, config,
                                        prefill_mask=mask)(features)
    np.testing.assert_array_equal(got["item_ids"].numpy(), want["item_ids"].numpy())
    tol = tolerance_for("float32")
    np.testing.assert_allclose(got["scores"].numpy(), want["scores"].numpy(),
                               atol=tol.atol, rtol=tol.rtol)
