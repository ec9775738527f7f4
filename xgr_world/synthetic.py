"""A synthetic recommendation world: a catalog with semantic IDs and users with histories.

NumPy only. Items belong to a hierarchy (level-0 code = category, level-1 = sub-category,
level-2 = position), so semantic IDs carry meaning; each user prefers a few categories and
sub-categories, so a model that reads the history can beat a popularity baseline. The last
event of each user is held out as the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xgr_common.errors import ConfigError, require


@dataclass(frozen=True)
class WorldConfig:
    num_items: int = 3000
    num_users: int = 2000
    levels: int = 3
    codebook_size: int = 256
    categories: int = 12          # level-0 codes in use
    subcategories: int = 6        # level-1 codes in use per category
    history_events: int = 40      # events per user before cleaning
    preferred_categories: int = 2
    context_values: int = 8
    popularity_exponent: float = 0.7   # item of popularity rank r has weight 1 / r**exponent
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.levels == 3, ConfigError, "the synthetic world builds 3-level semantic IDs")
        require(self.categories * self.subcategories <= self.codebook_size ** 2, ConfigError,
                "categories x subcategories exceed the codebook")
        require(self.num_items >= self.categories * self.subcategories, ConfigError,
                "need at least one item per sub-category")
        require(self.popularity_exponent >= 0, ConfigError,
                f"popularity_exponent must be >= 0, got {self.popularity_exponent}")


@dataclass(frozen=True)
class World:
    """All arrays are NumPy; ragged histories use TF's (values, row_splits) convention."""

    item_ids: np.ndarray          # [N] int64, unique, not contiguous
    item_codes: np.ndarray        # [N, levels] int32 in [0, codebook_size)
    item_popularity: np.ndarray   # [N] float64, sums to 1
    user_ids: np.ndarray          # [U] int64
    user_context: np.ndarray      # [U] object (bytes): a country code
    history_items: np.ndarray     # [E] int64 item ids, chronological per user
    history_times: np.ndarray     # [E] int64 unix seconds
    history_splits: np.ndarray    # [U+1] int64 row splits
    request_time: np.ndarray      # [U] int64 unix seconds
    target_items: np.ndarray      # [U] int64: the held-out next item


COUNTRIES = ("us", "gb", "de", "fr", "jp", "br", "in", "cn")


def make_world(config: WorldConfig = WorldConfig()) -> World:
    rng = np.random.default_rng(config.seed)
    n, cats, subs = config.num_items, config.categories, config.subcategories
    # Items: a category, a sub-category and a running index inside the pair as level 2.
    cat = rng.integers(0, cats, n)
    sub = rng.integers(0, subs, n)
    order = np.lexsort((sub, cat))
    codes = np.zeros((n, 3), dtype=np.int32)
    codes[order, 0], codes[order, 1] = cat[order], sub[order]
    pair = cat[order] * subs + sub[order]
    starts = np.r_[0, np.flatnonzero(np.diff(pair)) + 1]
    rank = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    codes[order, 2] = rank % config.codebook_size
    # Pairs with more than codebook_size items share level-2 codes: several items per path.
    item_ids = rng.choice(np.arange(10_000, 10_000 + 50 * n), size=n, replace=False).astype(np.int64)
    # A Zipf law over popularity ranks. (Raw Zipf samples are unbounded: one item would hold
    # nearly all the mass and every history would repeat it.)
    popularity = 1.0 / (rng.permutation(n) + 1.0) ** config.popularity_exponent
    popularity /= popularity.sum()

    users = np.arange(1, config.num_users + 1, dtype=np.int64) * 7919
    countries = np.array([COUNTRIES[i % len(COUNTRIES)].encode() for i in
                          rng.integers(0, config.context_values, config.num_users)], dtype=object)
    hist, times, splits, req, target = [], [], [0], [], []
    now = 1_750_000_000
    for _ in range(config.num_users):
        liked_cats = rng.choice(cats, config.preferred_categories, replace=False)
        liked_sub = rng.integers(0, subs, config.preferred_categories)
        weight = popularity.copy()
        for c, s in zip(liked_cats, liked_sub):
            weight[(codes[:, 0] == c)] *= 8.0
            weight[(codes[:, 0] == c) & (codes[:, 1] == s)] *= 6.0
        weight /= weight.sum()
        events = rng.choice(n, config.history_events + 1, p=weight)
        # Occasional immediate repeats, so duplicate collapsing has work to do.
        repeat = rng.random(config.history_events + 1) < 0.1
        events[1:][repeat[1:]] = events[:-1][repeat[1:]]
        gaps = rng.exponential(3 * 24 * 3600, config.history_events).astype(np.int64)
        t = now - np.cumsum(gaps[::-1])[::-1]
        hist.append(item_ids[events[:-1]])
        times.append(t)
        splits.append(splits[-1] + config.history_events)
        req.append(now + int(rng.integers(60, 3600)))
        target.append(item_ids[events[-1]])
    return World(item_ids=item_ids, item_codes=codes, item_popularity=popularity,
                 user_ids=users, user_context=countries,
                 history_items=np.concatenate(hist), history_times=np.concatenate(times),
                 history_splits=np.asarray(splits, dtype=np.int64),
                 request_time=np.asarray(req, dtype=np.int64),
                 target_items=np.asarray(target, dtype=np.int64))
