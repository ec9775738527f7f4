"""The batch job's files: the users to recommend for (one Parquet row per user, the feature
graph's request features, histories as list columns) and the results (one row per user: its
items and scores, best first)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from xgr_common.errors import InvalidInputError, require

# Scalar columns and list columns of a users file (the feature graph's request features);
# ``user_key`` is optional (a SavedModel with a prompt cache takes it).
SCALARS = {"user_id": "int64", "country": "string", "request_time": "int64"}
LISTS = {"history_items": "int64", "history_times": "int64"}


def write_users(path: str | os.PathLike, features: dict) -> Path:
    """A users file from request ``features`` (the feature graph's inputs, one row per user:
    ``xgr_world``'s ``features_from_world``, ``xgr_train.logs.requests_at``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays = {k: np.asarray(v.numpy() if hasattr(v, "numpy") else v)
              for k, v in features.items()}
    splits = arrays["history_splits"]
    columns = {"user_id": pa.array(arrays["user_id"].astype(np.int64)),
               "country": pa.array([c.decode() if isinstance(c, bytes) else str(c)
                                    for c in arrays["country"]], pa.string()),
               "request_time": pa.array(arrays["request_time"].astype(np.int64))}
    for name in LISTS:
        values = arrays[name].astype(np.int64)
        columns[name] = pa.ListArray.from_arrays(pa.array(splits.astype(np.int32)),
                                                 pa.array(values))
    path = Path(path)
    pq.write_table(pa.table(columns), path)
    return path


def read_rows(path: str | os.PathLike, start: int, stop: int) -> dict[str, np.ndarray]:
    """Rows ``[start, stop)`` of a users file as request features (ragged histories as values
    and row splits); ``InvalidInputError`` names a missing or mistyped column."""
    import pyarrow.parquet as pq

    table = _row_range(pq.ParquetFile(path), start, stop)
    missing = [c for c in (*SCALARS, *LISTS) if c not in table.column_names]
    require(not missing, InvalidInputError,
            f"users file {path} lacks column(s) {missing}; it needs {[*SCALARS, *LISTS]}")
    for name in (*SCALARS, *(["user_key"] if "user_key" in table.column_names else [])):
        require(table.column(name).null_count == 0, InvalidInputError,
                f"users file {path} column {name!r} has an empty (null) value in rows "
                f"[{start}, {stop})")
    features = {"user_id": table.column("user_id").to_numpy().astype(np.int64),
                "country": np.array([c.encode() for c in table.column("country").to_pylist()],
                                    dtype=object),
                "request_time": table.column("request_time").to_numpy().astype(np.int64)}
    lengths = None
    for name in LISTS:
        column = table.column(name).combine_chunks()
        require(column.null_count == 0, InvalidInputError,
                f"users file {path} column {name!r} has an empty (null) row")
        own = np.diff(column.offsets.to_numpy())
        require(lengths is None or np.array_equal(own, lengths), InvalidInputError,
                f"users file {path}: history_items and history_times differ in length on "
                f"some row")
        lengths = own
        features[name] = column.flatten().to_numpy().astype(np.int64)
    features["history_splits"] = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    if "user_key" in table.column_names:
        features["user_key"] = np.array([k.encode() for k in
                                         table.column("user_key").to_pylist()], dtype=object)
    return features


def _row_range(parquet, start: int, stop: int):
    """Rows ``[start, stop)`` reading only the row groups that hold them: each actor reads
    its own shards, not the whole file."""
    metadata = parquet.metadata
    groups, first, offset = [], None, 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        if offset < stop and offset + rows > start:
            groups.append(group)
            first = offset if first is None else first
        offset += rows
    if not groups:
        return parquet.schema_arrow.empty_table()
    return parquet.read_row_groups(groups).slice(start - first, stop - start)


def row_count(path: str | os.PathLike) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def write_results(path: Path, user_ids: np.ndarray, answers: list) -> Path:
    """One shard's results, one row per user: ``answers[i]`` is ``(item_ids, scores,
    num_items, None)`` for an answered user, ``(None, None, 0, message)`` for one the
    SavedModel refused (empty lists and the message in ``error``). Written to a temporary
    name and renamed: a shard's file exists only whole (what the job's resume counts on)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lengths = [0 if items is None else len(items) for items, _, _, _ in answers]
    offsets = pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32))
    answered = [a for a in answers if a[0] is not None]
    items = (np.concatenate([a[0] for a in answered]) if answered
             else np.zeros(0, np.int64)).astype(np.int64)
    scores = (np.concatenate([a[1] for a in answered]) if answered
              else np.zeros(0, np.float32)).astype(np.float32)
    table = pa.table({
        "user_id": pa.array(user_ids.astype(np.int64)),
        "item_ids": pa.ListArray.from_arrays(offsets, pa.array(items)),
        "scores": pa.ListArray.from_arrays(offsets, pa.array(scores)),
        "num_items": pa.array(np.asarray([a[2] for a in answers], np.int32)),
        "error": pa.array([a[3] for a in answers], pa.string())})
    partial = path.with_name(path.name + ".partial")
    pq.write_table(table, partial)
    os.replace(partial, path)
    return path
