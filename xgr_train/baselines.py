"""The baselines a trained model is measured against, counted on the training part of a
behaviour log only (a test event never reaches them):

- popularity: the catalog ranked by how often each item was taken;
- co-occurrence: the items that followed the request's last item(s), by how often one came
  right after the other in a user's events (item-to-item counts over consecutive events),
  popularity filling the rest of the list.

Both skip the items a request excludes (its cleaned history, as the engine does) and return
lists the pipeline's post-processor then cuts like the model's (``xgr_world.evaluation``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from xgr_common.errors import ConfigError, require
from xgr_train.logs import BehaviourLog
from xgr_world.evaluation import count_ranking, popularity_lists


def popularity(log: BehaviourLog, item_ids: np.ndarray) -> np.ndarray:
    """The catalog's ``item_ids``, most taken in ``log`` first (ties: smaller id first)."""
    return count_ranking(item_ids, log.items)


@dataclass(frozen=True)
class CoOccurrence:
    """``counts[a -> b]``: how often catalog item ``b`` came right after item ``a`` in one
    user's events, kept per ``a`` as ``nexts[starts[i]:starts[i + 1]]`` / ``counts`` for
    ``a = sources[i]`` (``sources`` ascending). ``ranking``: the popularity ranking that breaks
    ties and fills the lists; ``last_items``: how many of a request's latest history items
    vote, the latest with weight 1, the one before with 1/2, then 1/3, ...
    """

    sources: np.ndarray
    starts: np.ndarray
    nexts: np.ndarray
    counts: np.ndarray
    ranking: np.ndarray
    last_items: int = 1

    @classmethod
    def of(cls, log: BehaviourLog, item_ids: np.ndarray, ranking: np.ndarray | None = None,
           last_items: int = 1) -> "CoOccurrence":
        """Counts over the consecutive events of ``log``; only catalog items (``item_ids``)
        are counted as what followed. ``ranking``: default ``popularity(log, item_ids)``."""
        require(isinstance(last_items, int) and last_items >= 1, ConfigError,
                f"co-occurrence last_items must be an int >= 1, got {last_items!r}")
        ranking = popularity(log, item_ids) if ranking is None else ranking
        owner = np.repeat(np.arange(len(log.users)), np.diff(log.splits))
        same_user = owner[1:] == owner[:-1]
        before, after = log.items[:-1][same_user], log.items[1:][same_user]
        known = np.isin(after, item_ids)
        pairs = np.stack([before[known], after[known]], axis=1)
        if len(pairs):
            pairs, counts = np.unique(pairs, axis=0, return_counts=True)   # sorted by source
        else:
            pairs, counts = np.zeros((0, 2), np.int64), np.zeros(0, np.int64)
        sources, starts = np.unique(pairs[:, 0], return_index=True)
        return cls(sources.astype(np.int64), np.r_[starts, len(pairs)].astype(np.int64),
                   pairs[:, 1].astype(np.int64), counts.astype(np.int64),
                   np.asarray(ranking, np.int64), last_items)

    def following(self, item: int) -> tuple[np.ndarray, np.ndarray]:
        """(items, counts) that followed ``item`` in the counted log."""
        i = int(np.searchsorted(self.sources, item))
        if i == len(self.sources) or self.sources[i] != item:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        span = slice(int(self.starts[i]), int(self.starts[i + 1]))
        return self.nexts[span], self.counts[span]

    def ranked(self, recent: np.ndarray, excluded: np.ndarray, top_k: int) -> np.ndarray:
        """Up to ``top_k`` items (``[<= top_k]`` int64) for a request whose history ends with
        ``recent`` (oldest first): by weighted count after its last ``last_items`` items, ties
        by popularity, then the most popular of the rest; none of ``excluded``."""
        votes: dict[int, float] = {}
        for age, item in enumerate(np.asarray(recent, np.int64)[::-1][:self.last_items]):
            for following, count in zip(*self.following(int(item))):
                votes[int(following)] = votes.get(int(following), 0.0) + count / (age + 1)
        excluded = np.asarray(excluded, np.int64)
        candidates = np.fromiter(votes, np.int64, len(votes))
        candidates = candidates[~np.isin(candidates, excluded)]
        if len(candidates):
            place = self._places(candidates)
            weight = np.array([votes[int(c)] for c in candidates])
            candidates = candidates[np.lexsort((place, -weight))][:top_k]
        fill = popularity_lists(self.ranking, [np.r_[excluded, candidates]],
                                top_k - len(candidates))[0][0] if len(candidates) < top_k \
            else np.zeros(0, np.int64)
        return np.r_[candidates, fill[fill >= 0]].astype(np.int64)

    @cached_property
    def _order(self) -> np.ndarray:
        return np.argsort(self.ranking)

    def _places(self, items: np.ndarray) -> np.ndarray:
        """Positions of catalog ``items`` in the popularity ranking."""
        return self._order[np.searchsorted(self.ranking, items, sorter=self._order)]

    def lists(self, recent: list[np.ndarray], excluded: list[np.ndarray], top_k: int
              ) -> np.ndarray:
        """``ranked`` for each request: item ids ``[B, top_k]`` int64, -1 after the last."""
        ids = np.full((len(recent), top_k), -1, np.int64)
        for b, (history, seen) in enumerate(zip(recent, excluded)):
            kept = self.ranked(history, seen, top_k)
            ids[b, :len(kept)] = kept
        return ids
