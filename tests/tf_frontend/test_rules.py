"""The one rule set (``tf_frontend.rules``): history exclusion for the engine, post-processing."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_frontend.rules import BusinessRules, PostProcessor, engine_feeds, history_exclusion
from xgr_common.errors import ConfigError

IDS = tf.constant([[5, 7, -1, 9], [3, 4, 6, 8]], tf.int64)
SCORES = tf.constant([[-1.0, -2.0, -np.inf, -3.0], [-1.0, -1.5, -2.0, -2.5]])


def test_history_exclusion_pads_with_minus_one_and_keeps_a_column():
    values = tf.constant([7, 4, 8], tf.int64)
    out = history_exclusion(values, tf.constant([0, 1, 1, 3], tf.int64)).numpy()
    assert out.dtype == np.int64
    assert out.tolist() == [[7, -1, -1], [-1, -1, -1], [4, 8, -1]]
    # No history anywhere (and no rows at all) is still a valid engine input.
    empty = history_exclusion(tf.zeros([0], tf.int64), tf.constant([0, 0], tf.int64)).numpy()
    assert empty.tolist() == [[-1]]
    assert history_exclusion(tf.zeros([0], tf.int64),
                             tf.constant([0], tf.int64)).shape == (0, 1)


def _prompts(lengths, width):
    rows = len(lengths)
    tokens = np.arange(rows * width, dtype=np.int32).reshape(rows, width)
    return {"lengths": tf.constant(lengths, tf.int32), "token_ids": tf.constant(tokens),
            "segment_ids": tf.constant(tokens // 3)}


def test_engine_feeds_follow_the_exclude_history_rule():
    out = {**_prompts([3, 4], 6),
           "history_values": tf.constant([11, 12, 13], tf.int64),
           "history_splits": tf.constant([0, 2, 3], tf.int64)}
    feeds = engine_feeds(out, BusinessRules())
    assert feeds["exclude_items"].numpy().tolist() == [[11, 12, -1], [13, -1, -1]]
    assert feeds["lengths"] is out["lengths"]
    off = engine_feeds(out, BusinessRules(exclude_history=False))
    assert off["exclude_items"].numpy().tolist() == [[-1], [-1]]


@pytest.mark.parametrize("lengths, width, kept", [
    ([3, 4], 6, 4),      # the longest prompt of the batch
    ([1, 1], 6, 2),      # at least two columns, as engine packages take
    ([5, 9], 6, 6),      # never wider than emitted (a length past it is refused downstream)
    ([2], 1, 1),
])
def test_prompts_are_cut_to_the_batchs_longest(lengths, width, kept):
    out = _prompts(lengths, width)
    feeds = engine_feeds({**out, "history_values": tf.zeros([0], tf.int64),
                          "history_splits": tf.zeros([len(lengths) + 1], tf.int64)},
                         BusinessRules())
    np.testing.assert_array_equal(feeds["token_ids"].numpy(), out["token_ids"].numpy()[:, :kept])
    np.testing.assert_array_equal(feeds["segment_ids"].numpy(),
                                  out["segment_ids"].numpy()[:, :kept])


def test_post_processor_cuts_and_pads_to_top_n():
    out = PostProcessor(top_n=2)(IDS, SCORES)
    assert out["item_ids"].numpy().tolist() == [[5, 7], [3, 4]]
    assert out["num_items"].numpy().tolist() == [2, 2]
    wide = PostProcessor(top_n=6)(IDS, SCORES)
    assert wide["item_ids"].numpy().tolist() == [[5, 7, 9, -1, -1, -1], [3, 4, 6, 8, -1, -1]]
    assert np.isneginf(wide["scores"].numpy()[0, 3:]).all()
    assert wide["num_items"].numpy().tolist() == [3, 4]
    same_width = PostProcessor()(IDS, SCORES)
    assert same_width["item_ids"].shape == (2, 4)


def test_post_processor_drops_seen_items_only_when_asked():
    seen = tf.constant([[7, -1], [4, 8]], tf.int64)
    out = PostProcessor(top_n=3)(IDS, SCORES, seen)
    assert out["item_ids"].numpy().tolist() == [[5, 9, -1], [3, 6, -1]]
    assert out["scores"].numpy()[0, :2].tolist() == [-1.0, -3.0]
    kept = PostProcessor(BusinessRules(exclude_history=False), top_n=3)(IDS, SCORES, seen)
    assert kept["item_ids"].numpy().tolist() == [[5, 7, 9], [3, 4, 6]]


def test_blocked_items_and_category_cap():
    item_ids = np.array([3, 4, 5, 6, 7, 8, 9], np.int64)
    codes = np.array([[0, 0, 0], [0, 0, 1], [1, 0, 0], [0, 1, 0], [1, 1, 1], [0, 2, 2],
                      [2, 0, 0]], np.int32)
    post = PostProcessor(BusinessRules(blocked_items=(9,), max_per_category=1), 4,
                         item_ids, codes)
    out = post(IDS, SCORES)
    # Row 0: 5 (cat 1), 7 (cat 1, over the cap), 9 blocked. Row 1: 3 (cat 0), 4 and 6 and 8
    # (cat 0, over the cap).
    assert out["item_ids"].numpy().tolist() == [[5, -1, -1, -1], [3, -1, -1, -1]]
    assert out["num_items"].numpy().tolist() == [1, 1]


def test_bad_rules_raise_named_errors():
    with pytest.raises(ConfigError, match="max_per_category"):
        BusinessRules(max_per_category=0)
    with pytest.raises(ConfigError, match="blocked_items"):
        BusinessRules(blocked_items=("x",))
    with pytest.raises(ConfigError, match="needs the catalog"):
        PostProcessor(BusinessRules(max_per_category=2))
    with pytest.raises(ConfigError, match="top_n"):
        PostProcessor(top_n=0)
