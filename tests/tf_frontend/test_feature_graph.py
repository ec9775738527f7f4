"""The reference feature graph against a NumPy reference of the PromptSpec contract."""

import numpy as np
import pytest
import tensorflow as tf

from tests.tf_frontend.conftest import SPEC
from tests.tf_frontend.reference import profile_embeds, reference_outputs
from tf_frontend.feature_graph import INPUTS, OUTPUTS, STAGES, FeatureGraph, features_from_world
from xgr_common.errors import ConfigError, InvalidInputError
from xgr_common.prompt_spec import PromptSpec
from xgr_common.tolerances import tolerance_for

DAY = 86400
ID_OUTPUTS = ("token_ids", "segment_ids", "lengths", "history_values", "history_splits",
              "unknown_items")


def _numpy(features):
    return {k: v.numpy() for k, v in features.items()}


def _catalog(world, rows):
    return {int(i): world.item_codes[r] for r, i in zip(rows, world.item_ids[rows])}


def test_outputs_have_the_contract_dtypes_and_shapes(graph, world):
    out = graph(features_from_world(world, np.arange(5)))
    assert sorted(out) == sorted(OUTPUTS)
    L, S, H = SPEC.max_prompt_tokens, SPEC.profile_tokens, SPEC.model_hidden
    expected = {"token_ids": ("int32", (5, L)), "lengths": ("int32", (5,)),
                "segment_ids": ("int32", (5, L)), "profile_embeds": ("float32", (5, S, H)),
                "profile_ids": ("int64", (5, 2)), "history_splits": ("int64", (6,)),
                "unknown_items": ("int64", (5,))}
    for name, (dtype, shape) in expected.items():
        assert (out[name].dtype.name, tuple(out[name].shape)) == (dtype, shape), name
    assert out["history_values"].dtype == tf.int64 and out["history_values"].shape.rank == 1


def test_ids_match_the_reference_for_every_user(graph, world, catalog_rows):
    features = features_from_world(world, slice(None))
    out = graph(features)
    ref = reference_outputs(SPEC, _catalog(world, catalog_rows), _numpy(features))
    for name in ID_OUTPUTS:
        np.testing.assert_array_equal(out[name].numpy(), ref[name], err_msg=name)
    assert ref["unknown_items"].sum() > 0, "the world should exercise unknown items"


def test_every_cleaning_rule_on_a_hand_built_request(graph, world, catalog_rows):
    known = world.item_ids[catalog_rows[:3]]
    unknown = world.item_ids[0]  # row 0 is left out of the catalog (every ninth item)
    now = 1_800_000_000
    items = [known[0], known[1], known[1], unknown, known[2], known[0], known[2]]
    times = [now - 30 * DAY, now - SPEC.window_seconds, now - 9 * DAY, now - 8 * DAY,
             now - 7 * DAY, now - 5, now + 10]
    # dropped: too old (first), in the future (last); the run known[1], known[1] collapses.
    features = {"user_id": tf.constant([5], tf.int64), "country": tf.constant(["fr"]),
                "history_items": tf.constant(items, tf.int64),
                "history_times": tf.constant(times, tf.int64),
                "history_splits": tf.constant([0, len(items)], tf.int64),
                "request_time": tf.constant([now], tf.int64)}
    out = graph(features)
    assert out["history_values"].numpy().tolist() == [known[1], known[2], known[0]]
    assert out["unknown_items"].numpy().tolist() == [1]
    assert int(out["lengths"][0]) == 3 + 3 * (1 + SPEC.layout.levels) + 1
    assert int(out["token_ids"][0, 2]) == SPEC.context_token(SPEC.context_vocab.index("fr"))
    ref = reference_outputs(SPEC, _catalog(world, catalog_rows), _numpy(features))
    np.testing.assert_array_equal(out["token_ids"].numpy(), ref["token_ids"])


def test_context_lookup_maps_out_of_vocabulary_to_profile_base(graph, world):
    features = features_from_world(world, [0, 1, 2])
    features["country"] = tf.constant(["us", "zz", "cn"])
    tokens = graph(features)["token_ids"].numpy()[:, 2]
    assert tokens.tolist() == [SPEC.context_token(0), SPEC.layout.profile_base,
                               SPEC.context_token(len(SPEC.context_vocab) - 1)]


def test_profile_ids_are_tf_hash_buckets_of_user_and_country(graph, world):
    features = features_from_world(world, np.arange(8))
    ids = graph(features)["profile_ids"].numpy()
    buckets = SPEC.embedding_buckets
    user = tf.strings.to_hash_bucket_fast(tf.strings.as_string(features["user_id"]), buckets)
    country = tf.strings.to_hash_bucket_fast(features["country"], buckets)
    np.testing.assert_array_equal(ids, np.stack([user.numpy(), country.numpy()], axis=1))


def test_profile_embeds_match_a_float64_reference(graph, world, weights):
    out = graph(features_from_world(world, np.arange(10)))
    ref = profile_embeds(SPEC, weights["embedding_table"], weights["tower_weights"],
                         out["profile_ids"].numpy())
    tol = tolerance_for("float32")
    got = out["profile_embeds"].numpy().astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= tol.rel_norm
    np.testing.assert_allclose(got, ref, atol=tol.atol, rtol=tol.rtol)


def test_stages_are_named_layers_in_call_order(graph):
    assert tuple(layer.name for layer in graph.layers) == STAGES
    assert all(graph.stage(name).name == name for name in STAGES)


def test_replace_stage_swaps_one_stage_by_name(world, catalog_rows):
    graph = FeatureGraph(SPEC, world.item_ids[catalog_rows], world.item_codes[catalog_rows])
    features = features_from_world(world, [0, 1])
    before = graph(features)
    graph.replace_stage("context_lookup", lambda country: tf.zeros_like(country, tf.int64))
    after = graph(features)
    assert after["token_ids"].numpy()[:, 2].tolist() == [SPEC.layout.profile_base] * 2
    np.testing.assert_array_equal(after["token_ids"].numpy()[:, 3:],
                                  before["token_ids"].numpy()[:, 3:])
    with pytest.raises(InvalidInputError, match="unknown stage 'tower'"):
        graph.replace_stage("tower", lambda x: x)


def test_seed_decides_the_initial_weights(world, catalog_rows):
    ids, codes = world.item_ids[catalog_rows], world.item_codes[catalog_rows]
    features = features_from_world(world, [0, 1])
    a = FeatureGraph(SPEC, ids, codes, seed=1)(features)["profile_embeds"].numpy()
    b = FeatureGraph(SPEC, ids, codes, seed=1)(features)["profile_embeds"].numpy()
    c = FeatureGraph(SPEC, ids, codes, seed=2)(features)["profile_embeds"].numpy()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_bad_construction_arguments_are_named(world, catalog_rows, weights):
    ids, codes = world.item_ids[catalog_rows], world.item_codes[catalog_rows]
    with pytest.raises(InvalidInputError, match="embedding_table must have shape"):
        FeatureGraph(SPEC, ids, codes, embedding_table=np.zeros((3, 3)))
    bad = {**weights["tower_weights"], "profile_tower": [np.zeros((2, 2)), np.zeros(2)]}
    with pytest.raises(InvalidInputError, match=r"tower_weights\['profile_tower'\]"):
        FeatureGraph(SPEC, ids, codes, tower_weights=bad)
    with pytest.raises(ConfigError, match="levels"):
        FeatureGraph(SPEC, ids, codes[:, :2])
    with pytest.raises(ConfigError, match="profile_tokens"):
        FeatureGraph(PromptSpec(profile_tokens=0), ids, codes)
    from dataclasses import replace
    from xgr_common.prompt_v2 import PromptV2Layout
    with pytest.raises(ConfigError, match="FeatureGraph .* needs prompt version 1; this model's "
                                          "card \\(prompt_spec\\) says version 2"):
        FeatureGraph(replace(SPEC, prompt_v2=PromptV2Layout()), ids, codes)


def test_missing_features_are_named(graph, world):
    features = features_from_world(world, [0])
    del features["request_time"]
    with pytest.raises(InvalidInputError, match="request_time"):
        graph(features)


def test_features_from_world_rebases_the_ragged_history(world):
    features = features_from_world(world, [3, 1])
    assert {k: v.dtype for k, v in features.items()} == INPUTS
    splits = features["history_splits"].numpy()
    lengths = np.diff(world.history_splits)[[3, 1]]
    np.testing.assert_array_equal(splits, [0, lengths[0], lengths.sum()])
    lo, hi = world.history_splits[1], world.history_splits[2]
    np.testing.assert_array_equal(features["history_items"].numpy()[splits[1]:],
                                  world.history_items[lo:hi])
    assert features["country"].numpy().tolist() == list(world.user_context[[3, 1]])
