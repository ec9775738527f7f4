"""A team's behaviour log: who took which item when, read from Parquet, checked, and cut into
the requests the feature graph sees (a user's history up to an event, that event the target).

The file holds one row per event: ``user`` and ``item`` (integers), ``timestamp`` (unix
seconds, integer) and optionally ``context`` (a string, e.g. the country; a user's requests
take the context of the event they ask for). Other columns are ignored. Errors name the file,
the column and the first row at fault. Events are kept in time order per user (stable for
equal timestamps, as the file lists them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xgr_common.errors import ConfigError, InvalidInputError, require

COLUMNS = ("user", "item", "timestamp")
CONTEXT = "context"


@dataclass(frozen=True)
class BehaviourLog:
    """Events grouped by user, each user's in time order: user ``u`` (``users[u]``) has events
    ``splits[u]:splits[u + 1]`` of ``items`` / ``times`` / ``contexts``."""

    users: np.ndarray      # [U] int64, ascending
    splits: np.ndarray     # [U + 1] int64
    items: np.ndarray      # [E] int64
    times: np.ndarray      # [E] int64
    contexts: np.ndarray   # [E] object (bytes; b"" without a context column)

    @property
    def events(self) -> int:
        return len(self.items)

    def events_of(self, user_row: int) -> slice:
        return slice(int(self.splits[user_row]), int(self.splits[user_row + 1]))

    def keep(self, mask: np.ndarray) -> "BehaviourLog":
        """The log of the events where ``mask`` (``[E]`` bool) holds; users left with none go."""
        kept = np.r_[0, np.cumsum(mask, dtype=np.int64)]
        counts = kept[self.splits[1:]] - kept[self.splits[:-1]]
        users = counts > 0
        splits = np.r_[0, np.cumsum(counts[users])].astype(np.int64)
        return BehaviourLog(self.users[users], splits, self.items[mask], self.times[mask],
                            self.contexts[mask])


def read_logs(path: str | os.PathLike) -> BehaviourLog:
    """The behaviour log in ``path`` (Parquet), checked; ``ConfigError`` for a file that is not
    one, ``InvalidInputError`` naming the column and the first bad row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    require(path.is_file(), ConfigError, f"behaviour log {path} does not exist")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as error:
        raise ConfigError(f"behaviour log {path} is not a readable Parquet file: {error}") \
            from None
    missing = [c for c in COLUMNS if c not in table.column_names]
    require(not missing, InvalidInputError,
            f"behaviour log {path} lacks column(s) {missing}; it needs {list(COLUMNS)} (and "
            f"may have {CONTEXT!r}), found {table.column_names}")
    require(table.num_rows > 0, InvalidInputError, f"behaviour log {path} has no rows")
    arrays = {}
    for name in COLUMNS:
        column = table.column(name)
        require(pa.types.is_integer(column.type), InvalidInputError,
                f"behaviour log {path} column {name!r} must hold integers, got {column.type}")
        _no_nulls(path, name, column)
        arrays[name] = column.to_numpy().astype(np.int64)
    negative = np.flatnonzero(arrays["timestamp"] < 0)
    require(negative.size == 0, InvalidInputError,
            f"behaviour log {path} column 'timestamp' row {int(negative[0]) if negative.size else 0}"
            f": timestamps are unix seconds >= 0")
    if CONTEXT in table.column_names:
        column = table.column(CONTEXT)
        require(pa.types.is_string(column.type) or pa.types.is_large_string(column.type),
                InvalidInputError,
                f"behaviour log {path} column {CONTEXT!r} must hold strings, got {column.type}")
        _no_nulls(path, CONTEXT, column)
        contexts = np.array([value.encode() for value in column.to_pylist()], dtype=object)
    else:
        contexts = np.full(table.num_rows, b"", dtype=object)
    order = np.lexsort((arrays["timestamp"], arrays["user"]))   # by user, then time (stable)
    users = arrays["user"][order]
    starts = np.r_[0, np.flatnonzero(np.diff(users)) + 1]
    return BehaviourLog(users=users[starts], splits=np.r_[starts, len(users)].astype(np.int64),
                        items=arrays["item"][order], times=arrays["timestamp"][order],
                        contexts=contexts[order])


def _no_nulls(path: Path, name: str, column) -> None:
    if column.null_count:
        import pyarrow.compute as pc

        row = int(pc.index(pc.is_null(column), True).as_py())
        raise InvalidInputError(f"behaviour log {path} column {name!r} row {row} is empty "
                                f"(null)")


def write_logs(path: str | os.PathLike, users: np.ndarray, items: np.ndarray,
               times: np.ndarray, contexts: np.ndarray | None = None) -> Path:
    """A behaviour log file as ``read_logs`` reads it (for tests, benchmarks and the demo)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {"user": pa.array(np.asarray(users, np.int64)),
               "item": pa.array(np.asarray(items, np.int64)),
               "timestamp": pa.array(np.asarray(times, np.int64))}
    if contexts is not None:
        columns[CONTEXT] = pa.array([c.decode() if isinstance(c, bytes) else str(c)
                                     for c in contexts], pa.string())
    path = Path(path)
    pq.write_table(pa.table(columns), path)
    return path


@dataclass(frozen=True)
class Requests:
    """Requests cut from a log: ``features`` (the feature graph's inputs, NumPy, one row per
    request), the item each should produce (``targets [R]``) and whose they are
    (``user_rows [R]``: rows of the log's users)."""

    features: dict[str, np.ndarray]
    targets: np.ndarray
    user_rows: np.ndarray

    def __len__(self) -> int:
        return len(self.targets)


def requests_at(log: BehaviourLog, user_rows: np.ndarray, events: np.ndarray) -> Requests:
    """One request per (user row, event index within the log): the user's events before it as
    the history, its time as the request time, its context, its item as the target."""
    ids, contexts, items, times, lengths, request, targets = [], [], [], [], [], [], []
    for row, index in zip(np.asarray(user_rows).tolist(), np.asarray(events).tolist()):
        start = int(log.splits[row])
        ids.append(log.users[row])
        contexts.append(log.contexts[index])
        items.append(log.items[start:index])
        times.append(log.times[start:index])
        lengths.append(index - start)
        request.append(log.times[index])
        targets.append(log.items[index])
    splits = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    features = {
        "user_id": np.asarray(ids, np.int64), "country": np.asarray(contexts, dtype=object),
        "history_items": (np.concatenate(items) if items else np.zeros(0)).astype(np.int64),
        "history_times": (np.concatenate(times) if times else np.zeros(0)).astype(np.int64),
        "history_splits": splits, "request_time": np.asarray(request, np.int64)}
    return Requests(features, np.asarray(targets, np.int64), np.asarray(user_rows, np.int64))


def last_events(log: BehaviourLog, user_rows: np.ndarray, per_user: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(user rows, event indices) of each user's last ``per_user`` events that have at least
    one event before them."""
    rows, events = [], []
    for row in np.asarray(user_rows).tolist():
        start, end = int(log.splits[row]), int(log.splits[row + 1])
        for index in range(max(start + 1, end - per_user), end):
            rows.append(row)
            events.append(index)
    return np.asarray(rows, np.int64), np.asarray(events, np.int64)


def user_split(log: BehaviourLog, holdout: float, seed: int = 0
               ) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) user rows: a seeded ``holdout`` share of the users with at least
    two events is held out."""
    require(0 < holdout < 1, ConfigError, f"holdout must be in (0, 1), got {holdout!r}")
    eligible = np.flatnonzero(np.diff(log.splits) >= 2)
    rng = np.random.default_rng(seed)
    held = rng.choice(eligible, max(1, int(round(len(eligible) * holdout))), replace=False) \
        if len(eligible) else np.zeros(0, np.int64)
    train = np.setdiff1d(np.arange(len(log.users)), held)
    return train.astype(np.int64), np.sort(held).astype(np.int64)


def time_split(log: BehaviourLog, at: int) -> tuple[BehaviourLog, np.ndarray, np.ndarray]:
    """Train on the past, test on what follows: the log of the events before ``at`` (unix
    seconds), and (user rows, event indices) of each user's first event at or after ``at``
    that has an earlier event to build its history from."""
    rows, events = [], []
    for row in range(len(log.users)):
        span = log.events_of(row)
        later = np.flatnonzero(log.times[span] >= at)
        if later.size and later[0] > 0:
            rows.append(row)
            events.append(span.start + int(later[0]))
    past = log.keep(log.times < at)
    return past, np.asarray(rows, np.int64), np.asarray(events, np.int64)
