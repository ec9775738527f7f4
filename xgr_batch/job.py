"""``xgr batch``: every user of a users file (``xgr_batch.users``) through an exported
SavedModel on a Ray cluster, nightly style: the results of each shard of users written to
Parquet, resumable.

The users are cut into shards of ``rows_per_shard`` rows. A Ray Data pipeline hands the
shards that have no result file yet to a pool of ``actors`` actors (each with
``gpus_per_actor`` GPUs: Ray sets its ``CUDA_VISIBLE_DEVICES``, so an engine package compiled
for ``cuda:0`` runs on the GPU it is given); each actor loads the SavedModel once (TF and
``custom_ops``: what serving loads), runs its shard's users in batches of ``batch_size`` and
writes ``part-<shard>.parquet`` whole (written aside, then renamed). A job stopped half way
and started again skips the shards it finished: the result files are its checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xgr_batch.users import read_rows, row_count, write_results
from xgr_common.errors import ConfigError, require
from xgr_common.multi_gpu import NO_MULTICAST
from tf_frontend.serving.public_text import public_text
from xgr_common.serving_names import SERVING_SIGNATURE


@dataclass(frozen=True)
class BatchConfig:
    """One batch job. ``ray_address``: a running cluster's (``"auto"``, ``host:port``), or
    None to start a local one with ``local_cpus`` CPUs and the host's GPUs."""

    saved_model: str
    users: str
    out: str
    rows_per_shard: int = 10_000
    batch_size: int = 256
    actors: int = 1
    gpus_per_actor: float = 0.0
    cpus_per_actor: float = 1.0
    signature: str = SERVING_SIGNATURE
    ray_address: str | None = None
    local_cpus: int | None = None

    def __post_init__(self) -> None:
        for name in ("rows_per_shard", "batch_size", "actors"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, ConfigError,
                    f"BatchConfig.{name} must be a positive int, got {value!r}")
        require(self.gpus_per_actor >= 0 and self.cpus_per_actor > 0, ConfigError,
                f"BatchConfig needs gpus_per_actor >= 0 and cpus_per_actor > 0, got "
                f"{self.gpus_per_actor!r} and {self.cpus_per_actor!r}")


@dataclass(frozen=True)
class BatchReport:
    """What a run did: shards in all, those finished by an earlier run, users run now and
    how many of them the SavedModel refused (their rows carry the message in ``error``),
    the wall time and the throughput (users per second per actor too)."""

    shards: int
    done_before: int
    users: int
    refused: int
    seconds: float
    users_per_second: float
    users_per_second_per_actor: float
    out: str


def shard_file(out: Path, shard: int) -> Path:
    return out / f"part-{shard:06d}.parquet"


def _slice(features: dict, lo: int, hi: int) -> dict:
    """Rows ``[lo, hi)`` of request features (ragged histories rebased)."""
    splits = features["history_splits"]
    first, last = int(splits[lo]), int(splits[hi])
    out = {name: value[lo:hi] for name, value in features.items()
           if name not in ("history_items", "history_times", "history_splits")}
    out["history_items"] = features["history_items"][first:last]
    out["history_times"] = features["history_times"][first:last]
    out["history_splits"] = splits[lo:hi + 1] - first
    return out


class ShardRecommender:
    """A Ray actor: the SavedModel loaded once; each call recommends for its shards' users
    and writes their result files."""

    def __init__(self, saved_model: str, users: str, out: str, batch_size: int,
                 signature: str):
        import custom_ops  # noqa: F401  (registers TorchCall and the feature ops)
        import tensorflow as tf

        self._tf = tf
        # The loaded object is kept: its resources (the catalog's lookup table) live with it.
        self._loaded = tf.saved_model.load(saved_model)
        self._serve = self._loaded.signatures[signature]
        self._users, self._out, self._batch = users, Path(out), batch_size

    def _call(self, batch: dict) -> list:
        outputs = self._serve(**{name: self._tf.constant(value)
                                 for name, value in batch.items()})
        items, scores, counts = (outputs[name].numpy()
                                 for name in ("item_ids", "scores", "num_items"))
        return [(items[i], scores[i], int(counts[i]), None) for i in range(len(counts))]

    def _answers(self, batch: dict) -> list:
        """Each user's answer. A batch the SavedModel refuses (a user's bad data) is asked
        again user by user, so one bad row costs only itself; any other fault stops the
        job."""
        try:
            return self._call(batch)
        except self._tf.errors.InvalidArgumentError:
            answers = []
            for row in range(len(batch["user_id"])):
                try:
                    answers += self._call(_slice(batch, row, row + 1))
                except self._tf.errors.InvalidArgumentError as error:
                    answers.append((None, None, 0, public_text(error.message)))
            return answers

    def __call__(self, shards: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, refused = [], []
        for shard, start, stop in zip(shards["shard"], shards["start"], shards["stop"]):
            features = read_rows(self._users, int(start), int(stop))
            count = len(features["user_id"])
            answers = []
            for lo in range(0, count, self._batch):
                answers += self._answers(_slice(features, lo, min(lo + self._batch, count)))
            write_results(shard_file(self._out, int(shard)), features["user_id"], answers)
            rows.append(count)
            refused.append(sum(a[3] is not None for a in answers))
        return {"shard": shards["shard"], "users": np.asarray(rows, np.int64),
                "refused": np.asarray(refused, np.int64)}


def run_batch(config: BatchConfig, progress: bool = True) -> BatchReport:
    """Runs ``config``'s job (see the module docstring) and reports it."""
    import ray
    from tqdm.auto import tqdm

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    total = row_count(config.users)
    require(total > 0, ConfigError, f"users file {config.users} has no rows")
    shards = [(i, lo, min(lo + config.rows_per_shard, total))
              for i, lo in enumerate(range(0, total, config.rows_per_shard))]
    todo = [s for s in shards if not shard_file(out, s[0]).exists()]
    started = time.perf_counter()
    users = refused = 0
    if todo:
        if not ray.is_initialized():
            ray.init(address=config.ray_address, num_cpus=config.local_cpus,
                     include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": dict(NO_MULTICAST)})
        items = [{"shard": i, "start": lo, "stop": hi} for i, lo, hi in todo]
        done = ray.data.from_items(items).map_batches(
            ShardRecommender, batch_size=1, batch_format="numpy",
            fn_constructor_kwargs={"saved_model": str(config.saved_model),
                                   "users": str(config.users), "out": str(out),
                                   "batch_size": config.batch_size,
                                   "signature": config.signature},
            concurrency=config.actors, num_gpus=config.gpus_per_actor,
            num_cpus=config.cpus_per_actor)
        bar = tqdm(total=len(todo), desc="shards", unit="shard", disable=not progress)
        for row in done.iter_rows():
            users += int(row["users"])
            refused += int(row["refused"])
            bar.update(1)
        bar.close()
    seconds = time.perf_counter() - started
    rate = users / seconds if users else 0.0
    return BatchReport(shards=len(shards), done_before=len(shards) - len(todo), users=users,
                       refused=refused,
                       seconds=seconds, users_per_second=rate,
                       users_per_second_per_actor=rate / config.actors, out=str(out))
