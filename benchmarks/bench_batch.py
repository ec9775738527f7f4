"""``xgr batch`` on Ray: users per second per GPU over 1, 2, 4 and 8 actors, beside the same
SavedModel called directly in one process, in one run.

    python -m benchmarks.bench_batch --preset=qwen2-0.5b --device=cuda:0 --items=1000000 \\
        --paths=250000 --long_items=200 --recent_items=55 --beam_width=256 --top_k=300 \\
        --max_batch=64 --batch_size=64 --users=40000 --actor_counts=1,2,4,8
    python -m benchmarks.bench_batch    # a CPU smoke run at tiny sizes

1. A random-weight ``--preset`` with a version 2 prompt card (prompts of about
   ``4 x (long + recent)`` tokens) over ``--items`` catalog items, exported by ``xgr export``;
   ``--users`` users with their histories written to a users file (Parquet).
2. For each count of ``--actor_counts``: the batch job (``xgr_batch.run_batch``) over every
   user on a local Ray cluster, that many actors with one GPU each (on the CPU: no GPU, one
   CPU each), shards of ``--rows_per_shard``, ``--batch_size`` users a call. Its wall time
   includes the actors' start and model loads: the cost a nightly job pays.
3. The anchor: the SavedModel loaded in this process and its serving signature called over the
   same users at the same batch size, one GPU, no Ray (after the Ray runs, so it has the GPU
   alone). Its answers are the reference: the job's items for every user must equal them
   (exact at float32; at 16 bits the ranked-list rule's ties counted, not failed).

Writes ``results/batch_<date>_<label>.json`` and prints a table.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import app, flags

from benchmarks import results_file as rf
from benchmarks.serve_process import ROOT
from benchmarks import session_load
from benchmarks.session_load import define_world_flags, export_or_take, world_from_flags
from xgr_common.multi_gpu import NO_MULTICAST

FLAGS = flags.FLAGS
define_world_flags(long_items=12, recent_items=4,
                   device_note=" Each actor sees its own GPU as cuda:0.")
flags.adopt_module_key_flags(session_load)
flags.DEFINE_integer("users", 120, "Users in the users file.")
flags.DEFINE_list("actor_counts", ["1"], "Actor counts (one GPU each on a GPU host).")
flags.DEFINE_integer("rows_per_shard", 40, "Users per shard.")
flags.DEFINE_integer("batch_size", 16, "Users per SavedModel call.")
flags.DEFINE_integer("local_cpus", None, "CPUs of the local Ray cluster (unset: the host's).")
flags.DEFINE_string("saved_model", None, "Run this export instead of exporting: a plain one "
                    "made with the same world flags (preset, items, paths, long_items, "
                    "recent_items), as bench_served_cache's --work leaves in plain/.")
flags.DEFINE_bool("export_only", False, "Export into --work/saved and stop (a later run "
                  "takes it with --saved_model): lets a driver run the exports side by side.")
flags.DEFINE_string("work", None, "Working folder (default: a temporary one, removed).")
flags.DEFINE_string("label", "cpu", "Device label of the result file.")
flags.DEFINE_string("out_dir", os.path.join(ROOT, "benchmarks", "results"), "Result folder.")


def users_features(requests: list[dict]) -> dict[str, np.ndarray]:
    """One batch of request features from one-row requests (histories concatenated)."""
    lengths = [len(r["history_items"]) for r in requests]
    return {
        "user_id": np.concatenate([r["user_id"] for r in requests]),
        "country": np.concatenate([r["country"] for r in requests]),
        "request_time": np.concatenate([r["request_time"] for r in requests]),
        "history_items": np.concatenate([r["history_items"] for r in requests]),
        "history_times": np.concatenate([r["history_times"] for r in requests]),
        "history_splits": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)}


def direct_calls(saved: Path, users: Path, count: int, batch: int) -> tuple[dict, float]:
    """The anchor: the serving signature called in this process over every user; (items by
    user id, users per second after the first call)."""
    import custom_ops  # noqa: F401  (registers TorchCall and the feature ops)
    import tensorflow as tf

    from xgr_batch.job import _slice
    from xgr_batch.users import read_rows

    loaded = tf.saved_model.load(str(saved))
    serve = loaded.signatures["serving_default"]
    features = read_rows(users, 0, count)
    answers: dict[int, np.ndarray] = {}

    def call(lo: int, hi: int) -> None:
        part = _slice(features, lo, hi)
        out = serve(**{name: tf.constant(value) for name, value in part.items()})
        for user, items in zip(part["user_id"].tolist(), out["item_ids"].numpy()):
            answers[user] = items

    call(0, min(batch, count))                               # warm-up: loads, first capture
    started = time.perf_counter()
    for lo in range(0, count, batch):
        call(lo, min(lo + batch, count))
    return answers, count / (time.perf_counter() - started)


def job_answers(out: Path) -> dict[int, np.ndarray]:
    import pyarrow.parquet as pq

    table = pq.read_table(out).to_pydict()
    return {user: np.asarray(items) for user, items in zip(table["user_id"],
                                                           table["item_ids"])}


def main(argv: list[str]) -> None:
    del argv
    import torch_engine.model  # noqa: F401  (torch before TensorFlow on the GPU host)

    from xgr_batch.job import BatchConfig, run_batch
    from xgr_batch.users import write_users
    from xgr_common.tolerances import TIE_DTYPES

    os.environ.update(NO_MULTICAST)
    if FLAGS.batch_size > FLAGS.max_batch:
        raise app.UsageError(f"--batch_size {FLAGS.batch_size} exceeds --max_batch "
                             f"{FLAGS.max_batch}, the largest batch the export accepts")
    cuda = FLAGS.device.startswith("cuda")
    counts = sorted({int(c) for c in FLAGS.actor_counts})
    if FLAGS.export_only and not FLAGS.work:
        raise app.UsageError("--export_only needs --work (where the export stays)")
    rng = np.random.default_rng(0)
    work = Path(FLAGS.work or tempfile.mkdtemp(prefix="xgr_batch_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    world = world_from_flags(FLAGS.users)
    spec = world.prompt_spec()
    ids, codes = world.catalog(rng)
    saved, dtype = export_or_take(FLAGS.saved_model, work, world, ids, codes, 0)
    if FLAGS.export_only:
        print(f"exported to {saved}")
        return
    users = write_users(work / "users.parquet",
                        users_features(world.user_requests(ids, rng)))
    rows = []
    import ray
    try:
        for count in counts:
            out = work / f"out_{count}"
            report = run_batch(BatchConfig(
                saved_model=str(saved), users=str(users), out=str(out),
                rows_per_shard=FLAGS.rows_per_shard, batch_size=FLAGS.batch_size,
                actors=count, gpus_per_actor=1.0 if cuda else 0.0,
                local_cpus=FLAGS.local_cpus), progress=True)
            gpus = count if cuda else 0
            rows.append({"actors": count, "gpus": gpus, "users": report.users,
                         "refused": report.refused, "seconds": report.seconds,
                         "users_per_second": report.users_per_second,
                         "users_per_second_per_actor": report.users_per_second_per_actor,
                         "answers": job_answers(out)})
            print(f"{count} actor(s): {report.users} users in {report.seconds:.1f} s, "
                  f"{report.users_per_second:.1f} users/s, "
                  f"{report.users_per_second_per_actor:.1f} per {'GPU' if cuda else 'actor'}",
                  flush=True)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    reference, direct_rate = direct_calls(saved, users, FLAGS.users, FLAGS.batch_size)
    for row in rows:
        answers = row.pop("answers")
        differing = sum(not np.array_equal(answers.get(user, np.zeros(0)), items)
                        for user, items in reference.items())
        row["differing_from_direct"] = differing
        row["wrong"] = differing if dtype not in TIE_DTYPES else 0
        row["per_actor_over_direct"] = row["users_per_second_per_actor"] / direct_rate
    print(f"\n{FLAGS.preset}, {spec.max_prompt_tokens}-token prompts, beam {FLAGS.beam_width}, "
          f"top_k {FLAGS.top_k}, {FLAGS.users} users, batch {FLAGS.batch_size}, {dtype}")
    print(f"{'actors':>7}{'users/s':>10}{'per actor':>11}{'of direct':>11}{'differing':>11}")
    for row in rows:
        print(f"{row['actors']:>7}{row['users_per_second']:>10.1f}"
              f"{row['users_per_second_per_actor']:>11.1f}{row['per_actor_over_direct']:>11.2f}"
              f"{row['differing_from_direct']:>11}")
    print(f"{'direct':>7}{direct_rate:>10.1f}  (one process, the signature called directly)")
    path = rf.write_result(FLAGS.out_dir, "batch", {
        "date": rf.utc_now(), "preset": FLAGS.preset, "device": FLAGS.device, "dtype": dtype,
        "items": FLAGS.items, "prompt_tokens": spec.max_prompt_tokens,
        "beam_width": FLAGS.beam_width, "top_k": FLAGS.top_k, "users": FLAGS.users,
        "batch_size": FLAGS.batch_size, "rows_per_shard": FLAGS.rows_per_shard,
        "direct_users_per_second": direct_rate, "environment": dict(NO_MULTICAST),
        "rows": rows}, FLAGS.label)
    print(f"result: {path}")
    wrong = sum(row["wrong"] for row in rows)
    if not FLAGS.work:
        shutil.rmtree(work, ignore_errors=True)
    if wrong:
        raise SystemExit(f"{wrong} users' items differ from the direct calls'")


if __name__ == "__main__":
    app.run(main)
