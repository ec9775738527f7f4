"""Offline evaluation's parts on hand-made data: the metrics' exact values, the baselines'
exact lists, the splits, and that no test event reaches what the baselines count."""

from __future__ import annotations

import math

import numpy as np
import pytest

from xgr_common.errors import ConfigError, InvalidInputError
from xgr_train.baselines import CoOccurrence, popularity
from xgr_train.evaluate import DAY, EvaluateConfig, split_log
from xgr_train.logs import read_logs, write_logs
from xgr_world.evaluation import count_ranking, ndcg_at, popularity_lists, recall_at, \
    target_ranks

CATALOG = np.array([14, 10, 13, 11, 12], np.int64)


def test_metrics_on_hand_made_lists():
    lists = np.array([[5, 3, 9], [1, 2, 3], [7, 8, -1], [4, 6, 2]])
    targets = np.array([3, 4, 7, 2])
    assert target_ranks(lists, targets).tolist() == [2, 0, 1, 3]
    assert recall_at(lists, targets, 1) == 0.25
    assert recall_at(lists, targets, 2) == 0.5
    assert recall_at(lists, targets, 3) == 0.75
    assert ndcg_at(lists, targets, 1) == 0.25
    assert ndcg_at(lists, targets, 2) == pytest.approx((1 / math.log2(3) + 1) / 4, abs=1e-12)
    assert ndcg_at(lists, targets, 3) == pytest.approx((1 / math.log2(3) + 1 + 0.5) / 4,
                                                       abs=1e-12)
    with pytest.raises(InvalidInputError, match="recall@4 needs k >= 1 and at least 4 items"):
        recall_at(lists, targets, 4)
    with pytest.raises(InvalidInputError, match="NDCG@0"):
        ndcg_at(lists, targets, 0)


@pytest.fixture
def log(tmp_path):
    # user 1: 10 11 12; user 2: 10 11 13; user 3: 11 12; user 4: 13 11 13 (one event of an
    # item outside the catalog, 99, at the end of user 3).
    users = [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    items = [10, 11, 12, 10, 11, 13, 11, 12, 99, 13, 11, 13]
    times = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3]
    return read_logs(write_logs(tmp_path / "log.parquet", users, items, times))


def test_popularity_counts_catalog_items_ties_by_id(log):
    # counts: 11 x4, 13 x3, 10 x2, 12 x2, 14 x0; 99 is not in the catalog.
    assert popularity(log, CATALOG).tolist() == [11, 13, 10, 12, 14]
    assert count_ranking(CATALOG, []).tolist() == [10, 11, 12, 13, 14]
    ids, scores = popularity_lists(np.array([11, 13, 10, 12, 14]), [[11, 12], []], 4)
    assert ids.tolist() == [[13, 10, 14, -1], [11, 13, 10, 12]]
    assert scores.tolist() == [[0, -1, -2, -3]] * 2


def test_cooccurrence_ranks_what_followed_then_popularity(log):
    pairs = CoOccurrence.of(log, CATALOG)
    # 10->11 x2, 11->12 x2, 11->13 x2, 13->11 x1, 12->99 not counted (99 is not an item).
    assert pairs.following(11)[0].tolist() == [12, 13]
    assert pairs.following(11)[1].tolist() == [2, 2]
    assert pairs.following(12)[0].tolist() == []
    # After 11: 12 and 13 tie at 2, the more popular 13 first; then popularity fills.
    assert pairs.ranked(np.array([10, 11]), np.array([10, 11]), 4).tolist() == [13, 12, 14]
    assert pairs.ranked(np.array([11]), np.array([]), 4).tolist() == [13, 12, 11, 10]
    assert pairs.ranked(np.array([10]), np.array([10]), 3).tolist() == [11, 13, 12]
    # Nothing followed 99: popularity alone.
    assert pairs.ranked(np.array([99]), np.array([]), 2).tolist() == [11, 13]
    assert pairs.lists([np.array([10]), np.array([12])], [np.array([10]), np.array([])],
                       5).tolist() == [[11, 13, 12, 14, -1], [11, 13, 10, 12, 14]]


def test_cooccurrence_weighs_older_items_less(log):
    pairs = CoOccurrence.of(log, CATALOG, last_items=2)
    # History ... 13, 10: after 10 (weight 1) came 11 x2 -> 2; after 13 (weight 1/2) came
    # 11 x1 -> 0.5: 11 scores 2.5, the rest by popularity.
    assert pairs.ranked(np.array([13, 10]), np.array([13, 10]), 3).tolist() == [11, 12, 14]
    # History 11, 13 (13 latest): 11 gets 1 (after 13); 12 and 13 get 2 x 1/2 = 1 each after
    # 11; 13 is excluded; ties by popularity: 11, then 12.
    assert pairs.ranked(np.array([11, 13]), np.array([13]), 2).tolist() == [11, 12]
    with pytest.raises(ConfigError, match="last_items must be an int >= 1"):
        CoOccurrence.of(log, CATALOG, last_items=0)


def _config(tmp_path, **fields) -> EvaluateConfig:
    return EvaluateConfig(model=tmp_path, catalog=tmp_path, feature_graph=tmp_path,
                          logs=tmp_path / "log.parquet", **fields)


def test_time_split_tests_the_next_day_and_counts_only_the_past(tmp_path):
    day = 100 * DAY
    # user 1: day 100 (10, 11), day 101 (12, 13), day 102 (14); user 2: day 101 only.
    log = read_logs(write_logs(tmp_path / "log.parquet", [1, 1, 1, 1, 1, 2, 2],
                               [10, 11, 12, 13, 14, 11, 12],
                               [day + 5, day + 9, day + DAY + 1, day + DAY + 7,
                                day + 2 * DAY + 3, day + DAY + 2, day + DAY + 4]))
    # Default: the start of the last day (102): user 1's event there; user 2 has none.
    test = split_log(log, _config(tmp_path, split="time"))
    assert test.split == {"kind": "time", "test_from": day + 2 * DAY,
                          "test_until": day + 3 * DAY}
    assert log.items[test.events].tolist() == [14] and test.rows.tolist() == [0]
    assert test.train.times.max() < day + 2 * DAY and test.train.events == 6
    # From day 101: each user's first event of that day that has an earlier one; user 2's
    # first event has none, so it is no request. Day 102 is past the one tested day.
    test = split_log(log, _config(tmp_path, split="time", test_from=day + DAY))
    assert log.items[test.events].tolist() == [12]
    assert test.train.items.tolist() == [10, 11]
    with pytest.raises(ConfigError, match="leaves no events before it"):
        split_log(log, _config(tmp_path, split="time", test_from=day))


def test_no_test_event_reaches_the_baselines(tmp_path):
    # A burst after the cut: item 13 taken by everyone, always after 10. Counted, it would top
    # popularity and follow 10 in co-occurrence.
    users = [1, 2, 3, 1, 2, 3, 1, 2, 3]
    items = [10, 10, 10, 12, 11, 12, 13, 13, 13]
    times = [DAY, DAY, DAY, DAY + 1, DAY + 1, DAY + 1, 2 * DAY, 2 * DAY, 2 * DAY]
    log = read_logs(write_logs(tmp_path / "log.parquet", users, items, times))
    test = split_log(log, _config(tmp_path, split="time"))
    assert log.items[test.events].tolist() == [13, 13, 13]
    assert popularity(test.train, CATALOG).tolist() == [10, 12, 11, 13, 14]
    pairs = CoOccurrence.of(test.train, CATALOG)
    assert pairs.following(10)[0].tolist() == [11, 12] and pairs.following(12)[0].size == 0
    # Users split: the held-out user's events are not counted.
    test = split_log(log, _config(tmp_path, split="users", holdout=0.34, seed=0))
    held = int(test.rows[0])
    assert test.rows.tolist() == [held] and log.items[test.events].tolist() == [13]
    others = [i for i, user in enumerate(users) if user != log.users[held]]
    assert test.train.users.tolist() == sorted({users[i] for i in others})
    assert sorted(test.train.items.tolist()) == sorted(items[i] for i in others)


def test_users_split_takes_each_held_out_users_last_events(tmp_path):
    log = read_logs(write_logs(tmp_path / "log.parquet", [1] * 4 + [2] * 4,
                               [10, 11, 12, 13, 13, 12, 11, 10], [1, 2, 3, 4] * 2))
    test = split_log(log, _config(tmp_path, holdout=0.5, seed=1, events_per_user=2))
    held = int(test.rows[0])
    assert test.rows.tolist() == [held, held]
    assert test.events.tolist() == [held * 4 + 2, held * 4 + 3]
    assert test.split["held_out_users"] == 1 and test.train.users.tolist() == \
        [int(log.users[1 - held])]


@pytest.mark.parametrize("fields, match", [
    ({"split": "days"}, "split must be one of"),
    ({"holdout": 1.0}, r"holdout must be in \(0, 1\)"),
    ({"ks": (10, 200)}, r"ks \(10, 200\) go beyond top_k 100"),
    ({"ks": ()}, "ks must be a non-empty tuple"),
    ({"beam_width": 0}, "beam_width must be a positive int"),
    ({"max_requests": 0}, "max_requests must be a positive int"),
    ({"test_from": -1}, "test_from must be unix seconds"),
    ({"dtype": "int8"}, "dtype must be one of"),
])
def test_bad_settings_are_refused(tmp_path, fields, match):
    with pytest.raises(ConfigError, match=match):
        _config(tmp_path, **fields)
