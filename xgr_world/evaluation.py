"""Offline evaluation of the pipeline: recall@K and NDCG@K of its lists against baselines.

Every ranker sees the same rules: the request's cleaned history is excluded (the engine does
it through ``exclude_items``; a baseline skips those items) and the same TF ``PostProcessor``
then drops blocked and over-cap items, so the comparison measures the ranking alone.

The shared pieces work on plain arrays (``count_ranking``, ``popularity_lists``,
``target_ranks``, ``recall_at``, ``ndcg_at``, ``rank_requests``): ``xgr_train.evaluate`` runs
them on a team's behaviour log. ``popularity_ranking`` and ``evaluate`` are the demo world's
wrappers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import tensorflow as tf

from bridge.pipeline import RecommendPipeline, StageTimings
from tf_frontend.feature_graph import features_from_world
from xgr_common.errors import InvalidInputError, require
from xgr_world.synthetic import World

# A baseline ranker: (each request's excluded history [B] of int64 arrays, the batch's request
# features, top_k) -> item ids [B, top_k] int64, best first, -1 after the last.
Baseline = Callable[[list, dict, int], np.ndarray]


def count_ranking(item_ids: np.ndarray, taken: np.ndarray) -> np.ndarray:
    """The catalog's ``item_ids [N]``, most often in ``taken`` first (ties: smaller id first);
    items of ``taken`` outside the catalog are not counted. Returns ``[N]`` int64."""
    item_ids = np.asarray(item_ids, np.int64)
    order = np.argsort(item_ids)
    taken = np.asarray(taken, np.int64)
    position = np.searchsorted(item_ids, taken, sorter=order).clip(0, len(item_ids) - 1)
    rows = order[position]
    known = item_ids[rows] == taken
    counts = np.bincount(rows[known], minlength=len(item_ids))
    return item_ids[np.lexsort((item_ids, -counts))]


def popularity_ranking(world: World, users: np.ndarray) -> np.ndarray:
    """Item ids ``[N]`` int64, most taken first, counted over ``users``' histories and targets
    (ties: smaller item id first)."""
    take = np.concatenate([world.history_items[world.history_splits[u]:world.history_splits[u + 1]]
                           for u in users] + [world.target_items[users]])
    return count_ranking(world.item_ids, take)


def _rows(history) -> list:
    return history.to_list() if isinstance(history, tf.RaggedTensor) else list(history)


def popularity_lists(ranking: np.ndarray, history, top_k: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The ``top_k`` most popular items per row not in that row's ``history`` (a
    ``tf.RaggedTensor`` or a list of item-id arrays, one per row).

    Returns item ids ``[B, top_k]`` int64 (-1 where the ranking runs out) and scores
    ``[B, top_k]`` float32 (minus the rank, so higher is better, like the engine's scores).
    """
    rows = _rows(history)
    ids = np.full((len(rows), top_k), -1, np.int64)
    for b, seen in enumerate(rows):
        seen = np.asarray(seen, np.int64)
        head = ranking[:top_k + len(seen)]   # at most len(seen) of them are skipped
        kept = head[~np.isin(head, seen)][:top_k]
        ids[b, :len(kept)] = kept
    return ids, -np.arange(top_k, dtype=np.float32)[None, :].repeat(len(rows), axis=0)


def target_ranks(item_ids: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The 1-based position of each row's target in its list ``item_ids [R, N]`` (0 where the
    list does not hold it). Returns ``[R]`` int64."""
    hits = np.asarray(item_ids) == np.asarray(targets)[:, None]
    return np.where(hits.any(axis=1), hits.argmax(axis=1) + 1, 0).astype(np.int64)


def _need(item_ids: np.ndarray, k: int, what: str) -> None:
    require(k >= 1 and item_ids.shape[1] >= k, InvalidInputError,
            f"{what}@{k} needs k >= 1 and at least {k} items per row, got "
            f"{item_ids.shape[1]}")


def recall_at(item_ids: np.ndarray, targets: np.ndarray, k: int) -> float:
    """Share of rows whose target is among their first ``k`` items (``item_ids [U, >=k]``)."""
    _need(item_ids, k, "recall")
    ranks = target_ranks(item_ids[:, :k], targets)
    return float(np.mean(ranks > 0))


def ndcg_at(item_ids: np.ndarray, targets: np.ndarray, k: int) -> float:
    """Mean NDCG@k with one relevant item per row: ``1 / log2(rank + 1)`` where the target is
    at ``rank <= k`` of the row's list, 0 otherwise (the ideal list has it first)."""
    _need(item_ids, k, "NDCG")
    ranks = target_ranks(item_ids[:, :k], targets)
    gains = np.where(ranks > 0, 1.0 / np.log2(np.maximum(ranks, 1) + 1.0), 0.0)
    return float(np.mean(gains))


class Batches:
    """``count`` batches of request features, each made by ``make(index)`` when iterated to:
    a sized iterable, so a progress bar knows its total."""

    def __init__(self, count: int, make: Callable[[int], dict]):
        self.count, self.make = count, make

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return (self.make(index) for index in range(self.count))


@dataclass(frozen=True)
class RankedLists:
    """The lists of the model and of each baseline, after the same rules, for every request:
    ``model_items`` / ``model_scores`` and each of ``baselines`` ``[R, top_n]`` (best first,
    -1 after the last kept item); ``timings``: one ``StageTimings`` per pipeline batch."""

    model_items: np.ndarray
    model_scores: np.ndarray
    baselines: dict[str, np.ndarray]
    timings: tuple[StageTimings, ...]


def rank_requests(pipeline: RecommendPipeline, batches: Iterable[dict],
                  baselines: dict[str, Baseline], progress=None) -> RankedLists:
    """Run the pipeline over ``batches`` (its feature dicts) and rank each batch with every
    baseline beside it, as many items per request as the pipeline returns (``config.top_n``).

    A baseline excludes what the engine excluded (the cleaned history the pipeline reports;
    nothing when the rules keep history items) and its list then goes through the pipeline's
    post-processor. progress: optional callable wrapping the batch iterator (e.g. ``tqdm``).
    """
    top_k = pipeline.config.top_n
    exclude = pipeline.config.rules.exclude_history
    items, scores, timings = [], [], []
    ranked: dict[str, list[np.ndarray]] = {name: [] for name in baselines}
    for features in (progress(batches) if progress else batches):
        out = pipeline(features)
        items.append(out["item_ids"].numpy())
        scores.append(out["scores"].numpy())
        timings.append(out["timings"])
        history = (tf.RaggedTensor.from_row_splits(out["history_values"],
                                                   out["history_splits"]).to_list()
                   if exclude else [[] for _ in range(len(items[-1]))])
        history = [np.asarray(row, np.int64) for row in history]
        for name, baseline in baselines.items():
            ids = baseline(history, features, top_k)
            order = -np.arange(top_k, dtype=np.float32)[None, :].repeat(len(ids), axis=0)
            ranked[name].append(pipeline.post_process(
                tf.constant(ids, tf.int64), tf.constant(order))["item_ids"].numpy())
    require(bool(items), InvalidInputError, "rank_requests needs at least one batch")
    return RankedLists(np.concatenate(items), np.concatenate(scores),
                       {name: np.concatenate(lists) for name, lists in ranked.items()},
                       tuple(timings))


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

    batches = Batches(-(-len(users) // batch_size), lambda index: features_from_world(
        world, users[index * batch_size:(index + 1) * batch_size]))

    def popular(history, features, top_k):
        return popularity_lists(popularity, history, top_k)[0]

    lists = rank_requests(pipeline, batches, {"popularity": popular}, progress)
    return Evaluation(users=np.asarray(users), model_items=lists.model_items,
                      model_scores=lists.model_scores,
                      popular_items=lists.baselines["popularity"],
                      targets=world.target_items[users], timings=lists.timings)
