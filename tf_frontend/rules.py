"""The business rules of a recommendation list: one rule set for every pipeline.

The exported SavedModel (``xgr_export.saved_model``) and the in-process pipeline
(``bridge.pipeline.RecommendPipeline``) apply them the same way (``tf_frontend.pipeline_spec``
holds the halves both run):

* on the device, before items are ranked: the engine never returns an item of the request's
  cleaned history (``exclude_items``, built by ``history_exclusion``), so a list of ``top_n``
  is still full after the rule; a request's own exclusions (``with_request_exclusions``) join
  the history there;
* in TF, after the engine (``PostProcessor``): drop padding, blocked items and items over the
  per-category cap, compact the kept items to the front and cut the list to ``top_n``.

When the engine does not take ``exclude_items`` (a package exported without it), the
post-processor drops the history items instead (``seen``), so the rule holds either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from xgr_common.errors import ConfigError, require


@dataclass(frozen=True)
class BusinessRules:
    """Rules the ranking team applies to every list.

    blocked_items: item ids that must never be shown (withdrawn, out of stock, policy). The
        model was trained before they were blocked, so the engine may still produce them.
    max_per_category: at most this many items per level-0 code (the catalog's top category)
        in one list, keeping the best-scored ones; None = no cap. Keeps a list from being all
        one category when one dominates a user's history.
    exclude_history: never return an item of the request's cleaned history.
    """

    blocked_items: tuple[int, ...] = ()
    max_per_category: int | None = None
    exclude_history: bool = True

    def __post_init__(self) -> None:
        require(self.max_per_category is None or (isinstance(self.max_per_category, int)
                                                  and self.max_per_category >= 1), ConfigError,
                f"max_per_category must be None or an int >= 1, got {self.max_per_category}")
        require(all(isinstance(i, (int, np.integer)) for i in self.blocked_items), ConfigError,
                f"blocked_items must be item ids (ints), got {self.blocked_items!r}")


def history_exclusion(history_values: tf.Tensor, history_splits: tf.Tensor) -> tf.Tensor:
    """The engine's ``exclude_items``: each request's cleaned history as a padded matrix.

    history_values int64 [E], history_splits int64 [B+1] (the feature graph's outputs).
    Returns int64 [B, X] with X = longest history + 1 (at least one column, so a batch without
    any history is still a valid input), padded with -1.
    """
    history = tf.RaggedTensor.from_row_splits(history_values, history_splits)
    rows = tf.shape(history_splits, out_type=tf.int64)[0] - 1
    return tf.concat([history.to_tensor(default_value=-1),
                      tf.fill(tf.stack([rows, tf.constant(1, tf.int64)]),
                              tf.constant(-1, tf.int64))], axis=1)


def trimmed_prompts(out: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """``token_ids`` and ``segment_ids`` cut to the batch's longest prompt (at least 2 columns,
    at most what the graph emitted). A feature graph pads every prompt to its longest possible
    one; the engine's work follows the width it is given, so a batch of short histories from
    a model exported for long ones would pay for the whole context. Columns past every row's
    ``lengths`` are padding: cutting them changes no result."""
    tokens, lengths = out["token_ids"], out["lengths"]
    emitted = tf.shape(tokens)[1]
    longest = tf.reduce_max(tf.concat([tf.cast(lengths, tf.int32), [2]], axis=0))
    width = tf.minimum(emitted, longest)
    trimmed = {**out, "token_ids": tokens[:, :width]}
    if "segment_ids" in out:
        trimmed["segment_ids"] = out["segment_ids"][:, :width]
    return trimmed


def engine_feeds(out: dict[str, tf.Tensor], rules: BusinessRules) -> dict[str, tf.Tensor]:
    """The feature graph's outputs, prompts trimmed to the batch's longest
    (``trimmed_prompts``), plus ``exclude_items`` int64 [B, X] (the history the engine must not
    return, -1 padded; one -1 column when ``rules.exclude_history`` is off)."""
    out = trimmed_prompts(out)
    if rules.exclude_history:
        exclude = history_exclusion(out["history_values"], out["history_splits"])
    else:
        exclude = tf.fill(tf.stack([tf.shape(out["lengths"], out_type=tf.int64)[0],
                                    tf.constant(1, tf.int64)]), tf.constant(-1, tf.int64))
    return {**out, "exclude_items": exclude}


def with_request_exclusions(exclude: tf.Tensor, items: tf.Tensor, splits: tf.Tensor,
                            max_per_request: int) -> tf.Tensor:
    """``exclude`` (int64 [B, X], -1 padded: the history) with each request's own exclusions
    appended to its row: ``items`` int64 [N] partitioned by ``splits`` int64 [B+1] (out of
    stock, already shown, blocked for this user). Returns int64 [B, X'] with X' = the longest
    merged row + 1, -1 padded, which the engine applies on the device with the history, so
    a list stays full. A row over ``max_per_request`` ids, a negative id, or splits that do not
    partition ``items`` into B rows are refused (InvalidArgument naming the input)."""
    items, splits = tf.convert_to_tensor(items, tf.int64), tf.convert_to_tensor(splits, tf.int64)
    rows = tf.shape(exclude, out_type=tf.int64)[0]
    checks = [
        tf.debugging.assert_equal(
            tf.size(splits, out_type=tf.int64), rows + 1,
            message="exclude_splits must hold one more entry than the batch has requests"),
        tf.debugging.assert_equal(splits[0], tf.constant(0, tf.int64),
                                  message="exclude_splits must start at 0"),
        tf.debugging.assert_equal(
            splits[-1], tf.size(items, out_type=tf.int64),
            message="exclude_splits must end at the number of exclude_items"),
        tf.debugging.assert_non_negative(splits[1:] - splits[:-1],
                                         message="exclude_splits must be non-decreasing"),
        tf.debugging.assert_less_equal(
            splits[1:] - splits[:-1], tf.constant(max_per_request, tf.int64),
            message=f"exclude_items: a request may exclude at most {max_per_request} items"),
        tf.debugging.assert_non_negative(items, message="exclude_items must be item ids >= 0"),
    ]
    with tf.control_dependencies(checks):
        own = tf.RaggedTensor.from_row_splits(tf.identity(items), splits, validate=False)
    history = tf.RaggedTensor.from_tensor(exclude, padding=tf.constant(-1, tf.int64))
    merged = tf.concat([history, own], axis=1)
    return tf.concat([merged.to_tensor(default_value=-1),
                      tf.fill(tf.stack([rows, tf.constant(1, tf.int64)]),
                              tf.constant(-1, tf.int64))], axis=1)


def cut_to_request_top_k(item_ids: tf.Tensor, scores: tf.Tensor,
                         top_k: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The engine's lists (``item_ids`` int64 [B, K], ``scores`` float32 [B, K], best first)
    cut to each request's own ``top_k`` int32 [B] in [1, K]: -1 / -inf past it. The search's
    beams do not depend on top_k and its final pick is sorted, so a list cut to k is what the
    engine returns for top_k = k. A top_k outside [1, K] is refused (InvalidArgument)."""
    top_k = tf.cast(tf.convert_to_tensor(top_k), tf.int64)
    width = tf.shape(item_ids, out_type=tf.int64)[1]
    checks = [
        tf.debugging.assert_equal(tf.size(top_k, out_type=tf.int64),
                                  tf.shape(item_ids, out_type=tf.int64)[0],
                                  message="top_k must hold one value per request"),
        tf.debugging.assert_greater_equal(top_k, tf.constant(1, tf.int64),
                                          message="top_k must be >= 1"),
        tf.debugging.assert_less_equal(top_k, width,
                                       message="top_k must not exceed the top_k of the export"),
    ]
    with tf.control_dependencies(checks):
        keep = tf.range(width)[None, :] < tf.identity(top_k)[:, None]
    return (tf.where(keep, item_ids, tf.constant(-1, item_ids.dtype)),
            tf.where(keep, scores, tf.constant(float("-inf"), scores.dtype)))


class PostProcessor(tf.Module):
    """TF post-processing: drop padding, blocked, already-seen and over-cap items, then compact.

    ``__call__(item_ids int64 [B, K], scores float32 [B, K], seen int64 [B, X] or None)`` ->
    dict of ``item_ids [B, N]`` (kept items first in engine order, then -1), ``scores [B, N]``
    (-inf after the kept ones) and ``num_items int32 [B]``, with N = ``top_n`` (or K when
    ``top_n`` is None). ``seen`` (-1 padded) is only needed when the engine did not exclude the
    history itself.

    item_ids, item_codes: the catalog ([N] int64, [N, levels]); needed only for
    ``max_per_category`` (the category of an item is its level-0 code).
    """

    def __init__(self, rules: BusinessRules = BusinessRules(), top_n: int | None = None,
                 item_ids: np.ndarray | None = None, item_codes: np.ndarray | None = None):
        super().__init__(name="post_process")
        require(top_n is None or (isinstance(top_n, int) and top_n >= 1), ConfigError,
                f"top_n must be None or a positive int, got {top_n!r}")
        self.rules, self.top_n = rules, top_n
        self._category = None
        if rules.max_per_category is not None:
            require(item_ids is not None and item_codes is not None, ConfigError,
                    "max_per_category needs the catalog (item_ids and item_codes) to know each "
                    "item's category")
            self._category = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.constant(np.asarray(item_ids, np.int64)),
                tf.constant(np.asarray(item_codes)[:, 0].astype(np.int64))), default_value=-1)
        blocked = np.asarray(rules.blocked_items, np.int64)
        self._blocked = None
        if blocked.size:
            self._blocked = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.constant(blocked), tf.ones(blocked.shape, tf.int64)), default_value=0)

    @tf.function(reduce_retracing=True)
    def __call__(self, item_ids: tf.Tensor, scores: tf.Tensor,
                 seen: tf.Tensor | None = None) -> dict[str, tf.Tensor]:
        keep = item_ids >= 0
        if self._blocked is not None:
            keep &= tf.equal(self._blocked.lookup(item_ids), 0)
        if seen is not None and self.rules.exclude_history:
            keep &= ~tf.reduce_any(item_ids[:, :, None] == seen[:, None, :], axis=-1)
        if self._category is not None:
            category = self._category.lookup(item_ids)                               # [B, K]
            width = tf.shape(item_ids)[1]
            earlier = tf.linalg.band_part(tf.ones([width, width], tf.bool), -1, 0) & \
                ~tf.eye(width, dtype=tf.bool)                                      # j < i
            same = tf.equal(category[:, :, None], category[:, None, :]) & keep[:, None, :]
            rank = tf.reduce_sum(tf.cast(same & earlier[None], tf.int32), axis=2)
            keep &= rank < self.rules.max_per_category
        # Stable sort on "dropped": kept items move to the front in engine order.
        order = tf.argsort(tf.cast(~keep, tf.int32), axis=1, stable=True)
        kept = tf.gather(keep, order, batch_dims=1)
        ids = tf.where(kept, tf.gather(item_ids, order, batch_dims=1), tf.constant(-1, tf.int64))
        best = tf.where(kept, tf.gather(scores, order, batch_dims=1),
                        tf.constant(-np.inf, tf.float32))
        count = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)
        if self.top_n is not None:
            ids, best = _fit_width(ids, -1, self.top_n), _fit_width(best, -np.inf, self.top_n)
            count = tf.minimum(count, self.top_n)
        return {"item_ids": ids, "scores": best, "num_items": count}


def _fit_width(values: tf.Tensor, pad, width: int) -> tf.Tensor:
    """``values [B, K]`` cut or padded (with ``pad``) to ``[B, width]``."""
    values = values[:, :width]
    missing = width - tf.shape(values)[1]
    padded = tf.pad(values, [[0, 0], [0, missing]], constant_values=tf.cast(pad, values.dtype))
    return tf.ensure_shape(padded, [None, width])
