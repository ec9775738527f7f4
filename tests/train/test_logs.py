"""A team's behaviour log: read from Parquet in time order per user, refused with the column
and row at fault, cut into the requests the feature graph sees, split by users or by time."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xgr_common.errors import ConfigError, InvalidInputError
from xgr_train.logs import (last_events, read_logs, requests_at, time_split, user_split,
                            write_logs)


@pytest.fixture
def log_file(tmp_path):
    # Two users, rows out of order: user 2 at t=5, 6; user 1 at t=1, 2, 3.
    return write_logs(tmp_path / "log.parquet", [2, 1, 1, 2, 1], [10, 11, 12, 13, 14],
                      [5, 3, 1, 6, 2], ["us", "de", "de", "us", "fr"])


def test_events_are_grouped_by_user_in_time_order(log_file):
    log = read_logs(log_file)
    assert log.users.tolist() == [1, 2] and log.splits.tolist() == [0, 3, 5]
    assert log.items.tolist() == [12, 14, 11, 10, 13]
    assert log.times.tolist() == [1, 2, 3, 5, 6]
    assert log.contexts.tolist() == [b"de", b"fr", b"de", b"us", b"us"]


def test_requests_take_the_events_before_them(log_file):
    log = read_logs(log_file)
    rows, events = last_events(log, np.arange(2), 2)
    requests = requests_at(log, rows, events)
    assert requests.targets.tolist() == [14, 11, 13]
    features = requests.features
    assert features["history_splits"].tolist() == [0, 1, 3, 4]
    assert features["history_items"].tolist() == [12, 12, 14, 10]
    assert features["request_time"].tolist() == [2, 3, 6]
    assert features["country"].tolist() == [b"fr", b"de", b"us"]
    assert features["user_id"].tolist() == [1, 1, 2]


def test_splits_by_users_and_by_time(log_file):
    log = read_logs(log_file)
    train, held = user_split(log, 0.5, seed=0)
    assert sorted(train.tolist() + held.tolist()) == [0, 1] and len(held) == 1
    past, rows, events = time_split(log, at=3)
    # The past holds only events before t=3; user 1's first event at or after it is its third.
    assert past.users.tolist() == [1] and past.times.tolist() == [1, 2]
    assert rows.tolist() == [0] and log.items[events].tolist() == [11]


@pytest.mark.parametrize("table, match", [
    (pa.table({"user": [1], "item": [2]}), r"lacks column\(s\) \['timestamp'\]"),
    (pa.table({"user": [1, None], "item": [2, 3], "timestamp": [1, 2]}),
     "column 'user' row 1 is empty"),
    (pa.table({"user": [1], "item": [2.5], "timestamp": [1]}), "column 'item' must hold "
                                                              "integers"),
    (pa.table({"user": [1, 1], "item": [2, 3], "timestamp": [1, -4]}),
     "column 'timestamp' row 1: timestamps are unix seconds"),
    (pa.table({"user": pa.array([], pa.int64()), "item": pa.array([], pa.int64()),
               "timestamp": pa.array([], pa.int64())}), "has no rows"),
    (pa.table({"user": [1], "item": [2], "timestamp": [1], "context": [3]}),
     "column 'context' must hold strings"),
])
def test_bad_logs_are_refused_naming_the_column_and_row(tmp_path, table, match):
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    with pytest.raises(InvalidInputError, match=match):
        read_logs(path)


def test_a_file_that_is_not_parquet_is_refused(tmp_path):
    path = tmp_path / "log.parquet"
    path.write_text("user,item,timestamp\n1,2,3\n")
    with pytest.raises(ConfigError, match="not a readable Parquet file"):
        read_logs(path)
    with pytest.raises(ConfigError, match="does not exist"):
        read_logs(tmp_path / "none.parquet")
