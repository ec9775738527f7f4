"""A request's own controls: its exclusions joined to its history's exclusion row (the
engine's ``exclude_items``), its list cut to its own top_k, and the values that are refused."""

import numpy as np
import pytest
import tensorflow as tf

from tf_frontend.pipeline_spec import PipelineConfig, apply_controls, controls_signature
from tf_frontend.rules import cut_to_request_top_k, with_request_exclusions
from xgr_common.errors import ConfigError

HISTORY = tf.constant([[5, 6, -1], [-1, -1, -1]], tf.int64)


@pytest.mark.parametrize("traced", [False, True])
def test_each_row_gets_its_own_items_after_its_history(traced):
    merge = lambda e, i, s: with_request_exclusions(e, i, s, 4)  # noqa: E731
    if traced:   # as the SavedModel runs it
        merge = tf.function(merge)
    out = merge(HISTORY, tf.constant([9, 1, 2], tf.int64), tf.constant([0, 1, 3], tf.int64))
    np.testing.assert_array_equal(out.numpy(), [[5, 6, 9, -1], [1, 2, -1, -1]])
    # No exclusions at all: the history's row, still with one padding column.
    empty = merge(HISTORY, tf.constant([], tf.int64), tf.constant([0, 0, 0], tf.int64))
    np.testing.assert_array_equal(empty.numpy(), [[5, 6, -1], [-1, -1, -1]])


@pytest.mark.parametrize("items, splits, message", [
    ([9, -3], [0, 1, 2], "exclude_items must be item ids >= 0"),
    ([9], [0, 1], "one more entry than the batch has requests"),
    ([1, 2, 3, 4, 5], [0, 0, 5], "a request may exclude at most 4 items"),
    ([1, 2], [0, 3, 2], "non-decreasing"),
    ([1, 2], [1, 1, 2], "must start at 0"),
    ([1, 2], [0, 1, 1], "must end at the number of exclude_items"),
])
def test_bad_lists_are_refused_naming_the_rule(items, splits, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        with_request_exclusions(HISTORY, tf.constant(items, tf.int64),
                                tf.constant(splits, tf.int64), 4)


def test_controls_need_a_pipeline_that_takes_them():
    feeds = {"exclude_items": HISTORY}
    controls = {"exclude_items": tf.constant([1], tf.int64),
                "exclude_splits": tf.constant([0, 1, 1], tf.int64)}
    with pytest.raises(ConfigError, match="max_request_exclusions is 0"):
        apply_controls(feeds, controls, PipelineConfig())
    out = apply_controls(feeds, controls, PipelineConfig(max_request_exclusions=2))
    np.testing.assert_array_equal(out["exclude_items"].numpy(), [[5, 6, 1, -1], [-1, -1, -1, -1]])
    with pytest.raises(ConfigError, match="max_request_exclusions"):
        PipelineConfig(max_request_exclusions=-1)
    assert {"exclude_items", "exclude_splits", "top_k", "history_items"} <= set(
        controls_signature())


def test_each_list_is_cut_to_its_own_top_k():
    items = tf.constant([[7, 8, 9], [4, 5, -1]], tf.int64)
    scores = tf.constant([[-1.0, -2.0, -3.0], [-0.5, -0.6, float("-inf")]])
    got_items, got_scores = cut_to_request_top_k(items, scores, tf.constant([2, 3], tf.int32))
    np.testing.assert_array_equal(got_items.numpy(), [[7, 8, -1], [4, 5, -1]])
    np.testing.assert_array_equal(got_scores.numpy(), np.float32([[-1.0, -2.0, -np.inf],
                                                                  [-0.5, -0.6, -np.inf]]))
    for top_k, message in (([0, 3], "top_k must be >= 1"),
                           ([2, 4], "must not exceed the top_k of the export"),
                           ([2], "one value per request")):
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            cut_to_request_top_k(items, scores, tf.constant(top_k, tf.int32))
