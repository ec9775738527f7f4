"""The in-process pipeline on the quick model: valid items, rules, determinism, batching."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from bridge.pipeline import BusinessRules, PostProcessor, RecommendPipeline
from tf_frontend.feature_graph import features_from_world
from xgr_common.errors import ConfigError, InvalidInputError
from xgr_common.layout import MaskMode
from xgr_common.tolerances import tolerance_for

BEAM, TOP_K = 32, 24


@pytest.fixture(scope="module")
def users(quick_model):
    return quick_model.settings.eval_users[:6]


@pytest.fixture(scope="module")
def pipeline(make_pipeline, quick_model) -> RecommendPipeline:
    built = make_pipeline()
    return RecommendPipeline(built.feature_graph, built.engine, quick_model.world.item_ids,
                             quick_model.world.item_codes,
                             prefill_mask=quick_model.settings.train.mask_mode)


def _history(out) -> list[set[int]]:
    ragged = tf.RaggedTensor.from_row_splits(out["history_values"], out["history_splits"])
    return [set(row) for row in ragged.to_list()]


def test_items_exist_are_unseen_and_best_first(pipeline, quick_model, users):
    world = quick_model.world
    out = pipeline.recommend(features_from_world(world, users), BEAM, TOP_K)
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
    first = pipeline.recommend(features, BEAM, TOP_K)
    second = pipeline.recommend(features, BEAM, TOP_K)
    np.testing.assert_array_equal(first["item_ids"].numpy(), second["item_ids"].numpy())
    np.testing.assert_array_equal(first["scores"].numpy(), second["scores"].numpy())


def test_batched_equals_one_by_one(pipeline, quick_model, users):
    world = quick_model.world
    batched = pipeline.recommend(features_from_world(world, users), BEAM, TOP_K)
    tol = tolerance_for("float32")
    for row, user in enumerate(users):
        single = pipeline.recommend(features_from_world(world, [user]), BEAM, TOP_K)
        np.testing.assert_array_equal(single["item_ids"].numpy()[0],
                                      batched["item_ids"].numpy()[row])
        np.testing.assert_allclose(single["scores"].numpy()[0], batched["scores"].numpy()[row],
                                   atol=tol.atol, rtol=tol.rtol)


def test_item_causal_pipeline_hands_segment_ids_to_the_engine(make_pipeline, pipeline,
                                                              quick_model, users):
    """The quick model is trained causal; an item-causal pipeline over it must still return
    valid lists, with other scores (the hybrid mask changes the prompt's attention)."""
    features = features_from_world(quick_model.world, users)
    hybrid = make_pipeline().recommend(features, BEAM, TOP_K)        # default: ITEM_CAUSAL
    causal = pipeline.recommend(features, BEAM, TOP_K)
    assert pipeline.prefill_mask is MaskMode.CAUSAL
    assert not np.array_equal(hybrid["scores"].numpy(), causal["scores"].numpy())
    assert np.all(hybrid["num_items"].numpy() > 0)


def test_rules_drop_blocked_items_and_cap_categories(make_pipeline, quick_model, users):
    world = quick_model.world
    features = features_from_world(world, users)
    plain = make_pipeline().recommend(features, BEAM, TOP_K)["item_ids"].numpy()
    blocked = tuple(int(i) for i in plain[:, 0])                  # everyone's first choice
    ruled = make_pipeline(BusinessRules(blocked_items=blocked, max_per_category=3))
    out = ruled.recommend(features, BEAM, TOP_K)
    items, count = out["item_ids"].numpy(), out["num_items"].numpy()
    category = dict(zip(world.item_ids.tolist(), world.item_codes[:, 0].tolist()))
    for row in range(len(users)):
        kept = items[row, :count[row]].tolist()
        assert not set(kept) & set(blocked)
        per_category = np.bincount([category[i] for i in kept])
        assert per_category.max() <= 3
        # The survivors keep the engine's order.
        order = [plain[row].tolist().index(i) for i in kept]
        assert order == sorted(order)


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
    out = pipeline.recommend(features_from_world(quick_model.world, users), BEAM, TOP_K)
    rows = dict(out["timings"].rows())
    assert list(rows) == ["feature_graph", "bridge_in", "engine", "bridge_out", "post_process",
                          "total"]
    assert all(ms >= 0 for ms in rows.values())
    assert rows["total"] == pytest.approx(sum(v for k, v in rows.items() if k != "total"))


def test_bad_inputs_raise_named_errors(pipeline, quick_model, users):
    features = features_from_world(quick_model.world, users)
    with pytest.raises(InvalidInputError, match="dict"):
        pipeline.recommend(list(features.values()), BEAM, TOP_K)
    with pytest.raises(InvalidInputError, match="request_time"):
        pipeline.recommend({k: v for k, v in features.items() if k != "request_time"},
                           BEAM, TOP_K)
    with pytest.raises(InvalidInputError, match="top_k"):
        pipeline.recommend(features, 4, 10_000)
    with pytest.raises(ConfigError, match="max_per_category"):
        BusinessRules(max_per_category=0)
    with pytest.raises(ConfigError, match="prefill_mask"):
        RecommendPipeline(pipeline.feature_graph, pipeline.engine, quick_model.world.item_ids,
                          quick_model.world.item_codes, prefill_mask=MaskMode.SEGMENT_BIDIRECTIONAL)


def test_one_rule_set_for_both_in_process_pipelines(make_pipeline, quick_model, users):
    """``RecommendPipeline`` and ``xgr_export.saved_model.PythonPipeline`` (the exported
    SavedModel's reference) apply the same rules the same way: history excluded on the device,
    blocked items and the category cap after the engine."""
    import torch

    from xgr_export.saved_model import PipelineConfig, PythonPipeline

    world = quick_model.world
    plain = make_pipeline().recommend(features_from_world(world, users), BEAM, TOP_K)
    blocked = tuple(int(i) for i in plain["item_ids"].numpy()[:, 0] if i >= 0)
    rules = BusinessRules(blocked_items=blocked, max_per_category=4)
    ruled = make_pipeline(rules)
    engine = ruled.engine

    def recommend(token_ids, lengths, segment_ids, profile_embeds, exclude_items):
        with torch.no_grad():
            return engine.recommend(token_ids, lengths, segment_ids, BEAM, TOP_K,
                                    prefix_embeds=profile_embeds.to(engine.dtype),
                                    exclude_items=exclude_items)

    features = features_from_world(world, users)
    want = ruled.recommend(features, BEAM, TOP_K)
    got = PythonPipeline(ruled.feature_graph, recommend, PipelineConfig(top_n=TOP_K, rules=rules),
                         catalog=(world.item_ids, world.item_codes))(features)
    np.testing.assert_array_equal(got["item_ids"].numpy(), want["item_ids"].numpy())
    np.testing.assert_array_equal(got["num_items"].numpy(), want["num_items"].numpy())
    items = got["item_ids"].numpy()
    assert not set(blocked) & set(items.ravel().tolist())
    for row, seen in zip(items, _history(want)):
        assert not set(row.tolist()) & seen
