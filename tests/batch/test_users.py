"""The batch job's files: a shard read from only its row groups equals the same rows of the
whole file, a bad file is refused naming the column, a refused user's result row keeps the
message and no items."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from xgr_batch.users import read_rows, write_results, write_users
from xgr_common.errors import InvalidInputError

USERS = 23


def _features(users: int = USERS) -> dict:
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 6, users)
    splits = np.r_[0, np.cumsum(lengths)]
    return {"user_id": np.arange(100, 100 + users), "country": np.array([b"US", b"DE"] *
                                                                        users)[:users],
            "request_time": np.full(users, 10_000),
            "history_items": rng.integers(0, 50, splits[-1]),
            "history_times": np.sort(rng.integers(0, 9_000, splits[-1])),
            "history_splits": splits}


@pytest.mark.parametrize("start, stop", [(0, 23), (3, 9), (5, 6), (20, 23), (7, 7)])
def test_a_shard_reads_as_the_same_rows_of_the_whole_file(tmp_path, start, stop):
    features = _features()
    path = write_users(tmp_path / "users.parquet", features)
    pq.write_table(pq.read_table(path), path, row_group_size=4)   # six row groups
    assert pq.ParquetFile(path).metadata.num_row_groups == 6
    got = read_rows(path, start, stop)
    splits = features["history_splits"]
    assert got["user_id"].tolist() == features["user_id"][start:stop].tolist()
    assert got["country"].tolist() == features["country"][start:stop].tolist()
    lo, hi = splits[start], splits[stop]
    assert got["history_items"].tolist() == features["history_items"][lo:hi].tolist()
    assert got["history_splits"].tolist() == (splits[start:stop + 1] - lo).tolist()


def test_a_missing_or_null_column_is_named(tmp_path):
    path = write_users(tmp_path / "users.parquet", _features())
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["request_time"]), tmp_path / "missing.parquet")
    with pytest.raises(InvalidInputError, match=r"lacks column\(s\) \['request_time'\]"):
        read_rows(tmp_path / "missing.parquet", 0, USERS)
    countries = table.column("country").to_pylist()
    countries[4] = None
    pq.write_table(table.set_column(1, "country", pa.array(countries, pa.string())),
                   tmp_path / "null.parquet")
    with pytest.raises(InvalidInputError, match="column 'country' has an empty"):
        read_rows(tmp_path / "null.parquet", 0, USERS)


def test_a_refused_user_keeps_its_message_and_no_items(tmp_path):
    answers = [(np.array([5, 6, 7]), np.array([0.5, 0.25, 0.125]), 3, None),
               (None, None, 0, "history_times must be non-decreasing inside each row"),
               (np.array([8, 9, 1]), np.array([0.75, 0.5, -1.0]), 2, None)]
    path = write_results(tmp_path / "part-000000.parquet", np.array([1, 2, 3]), answers)
    got = pq.read_table(path).to_pydict()
    assert got["item_ids"] == [[5, 6, 7], [], [8, 9, 1]]
    assert got["scores"] == [[0.5, 0.25, 0.125], [], [0.75, 0.5, -1.0]]
    assert got["num_items"] == [3, 0, 2]
    assert got["error"] == [None, "history_times must be non-decreasing inside each row", None]
    assert not list(tmp_path.glob("*.partial"))
