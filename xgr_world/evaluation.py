"""Offline evaluation of the pipeline on held-out users: recall@K against a popularity baseline.

Both rankers see the same rules: the request's cleaned history is excluded (the engine does it
through ``exclude_items``; the baseline skips those items) and the same TF ``PostProcessor``
then drops blocked and over-cap items, so the comparison measures the ranking alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from bridge.pipeline import RecommendPipeline, StageTimings
from tf_frontend.feature_graph import features_from_world
from xgr_common.errors import InvalidInputError, require
from xgr_world.synthetic import World


def popularity_ranking(world: World, users: np.ndarray) -> np.ndarray:
    """Item ids ``[N]`` int64, most taken first, counted over ``users``' histories and targets
    (ties: smaller item id first)."""
    take = np.concatenate([world.history_items[world.history_splits[u]:world.history_splits[u + 1]]
                           for u in users] + [world.target_items[users]])
    counts = np.zeros(len(world.item_ids), np.int64)
    order = np.argsort(world.item_ids)
    np.add.at(counts, order[np.searchsorted(world.item_ids, take, sorter=order)], 1)
    ranked = np.lexsort((world.item_ids, -counts))
    return world.item_ids[ranked].astype(np.int64)


def popularity_lists(ranking: np.ndarray, history: tf.RaggedTensor, top_k: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The ``top_k`` most popular items per row not in that row's ``history``.

    Returns item ids ``[B, top_k]`` int64 and scores ``[B, top_k]`` float32 (minus the rank,
    so higher is better, like the engine's scores).
    """
    rows = history.to_list()
    ids = np.full((len(rows), top_k), -1, np.int64)
    for b, seen in enumerate(rows):
        kept = ranking[~np.isin(ranking, np.asarray(seen, np.int64))][:top_k]
        ids[b, :len(kept)] = kept
    return ids, -np.arange(top_k, dtype=np.float32)[None, :].repeat(len(rows), axis=0)


def recall_at(item_ids: np.ndarray, targets: np.ndarray, k: int) -> float:
    """Share of rows whose target is among their first ``k`` items (``item_ids [U, >=k]``)."""
    require(item_ids.shape[1] >= k, InvalidInputError,
            f"recall@{k} needs at least {k} items per row, got {item_ids.shape[1]}")
    return float(np.mean(np.any(item_ids[:, :k] == targets[:, None], axis=1)))


@dataclass(frozen=True)
class Evaluation:
    """Recommendations and recall of the model and of popularity on some users.

    model_items / popular_items: ``[U, top_k]`` int64 after the rules; targets ``[U]``;
    timings: one ``StageTimings`` per pipeline batch.
    """

    users: np.ndarray
    model_items: np.ndarray
    model_scores: np.ndarray
    popular_items: np.ndarray
    targets: np.ndarray
    timings: tuple[StageTimings, ...]

    def recall(self, k: int) -> tuple[float, float]:
        """(model, popularity) recall@k."""
        return (recall_at(self.model_items, self.targets, k),
                recall_at(self.popular_items, self.targets, k))


def evaluate(pipeline: RecommendPipeline, world: World, users: np.ndarray,
             popularity: np.ndarray, batch_size: int = 64, progress=None) -> Evaluation:
    """Run the pipeline over ``users`` (world rows) in batches; rank popularity alongside, as
    many items per user as the pipeline returns (its ``config.top_n``).

    progress: optional callable wrapping the batch iterator (e.g. ``tqdm``).
    """
    require(len(users) > 0, InvalidInputError, "evaluate needs at least one user")
    top_k = pipeline.config.top_n
    starts = range(0, len(users), batch_size)
    items, scores, popular, timings = [], [], [], []
    for start in (progress(starts) if progress else starts):
        rows = users[start:start + batch_size]
        out = pipeline(features_from_world(world, rows))
        items.append(out["item_ids"].numpy())
        scores.append(out["scores"].numpy())
        timings.append(out["timings"])
        history = tf.RaggedTensor.from_row_splits(out["history_values"], out["history_splits"])
        pop_ids, pop_scores = popularity_lists(popularity, history, top_k)
        popular.append(pipeline.post_process(tf.constant(pop_ids),
                                             tf.constant(pop_scores))["item_ids"].numpy())
    return Evaluation(users=np.asarray(users), model_items=np.concatenate(items),
                      model_scores=np.concatenate(scores), popular_items=np.concatenate(popular),
                      targets=world.target_items[users], timings=tuple(timings))
