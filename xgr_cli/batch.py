"""``xgr batch --saved_model DIR --users FILE --out DIR``: recommend for every user of a
Parquet file through an exported SavedModel on a Ray cluster (``xgr_batch.job``); the
results to ``OUT/part-*.parquet``; started again, it skips the shards it finished."""

from __future__ import annotations

from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("saved_model", None, "An exported SavedModel version folder.")
flags.DEFINE_string("users", None, "Users file (Parquet: user_id, country, request_time, "
                    "history_items and history_times as lists; optional user_key).")
flags.DEFINE_string("out", None, "Results folder: one part-<shard>.parquet per shard.")
flags.DEFINE_integer("rows_per_shard", 10_000, "Users per shard (the unit of resumption).")
flags.DEFINE_integer("batch_size", 256, "Users per SavedModel call.")
flags.DEFINE_integer("actors", 1, "Actors that run the SavedModel (one per GPU).")
flags.DEFINE_float("gpus_per_actor", 0.0, "GPUs each actor takes (1 on a GPU cluster).")
flags.DEFINE_float("cpus_per_actor", 1.0, "CPUs each actor takes.")
flags.DEFINE_string("ray_address", None, "A running Ray cluster ('auto', host:port); unset: "
                    "a local one.")
flags.DEFINE_integer("local_cpus", None, "CPUs of the local cluster (unset: the host's).")
for name in ("saved_model", "users", "out"):
    flags.mark_flag_as_required(name)


def main(argv: list[str]) -> int:
    del argv
    from xgr_batch.job import BatchConfig, run_batch

    report = run_batch(BatchConfig(
        saved_model=FLAGS.saved_model, users=FLAGS.users, out=FLAGS.out,
        rows_per_shard=FLAGS.rows_per_shard, batch_size=FLAGS.batch_size,
        actors=FLAGS.actors, gpus_per_actor=FLAGS.gpus_per_actor,
        cpus_per_actor=FLAGS.cpus_per_actor, ray_address=FLAGS.ray_address,
        local_cpus=FLAGS.local_cpus))
    print(f"{report.users} users in {report.seconds:.1f} s "
          f"({report.users_per_second:.1f}/s, {report.users_per_second_per_actor:.1f}/s per "
          f"actor), {report.refused} refused (their message in the `error` column); "
          f"{report.shards} shards, {report.done_before} finished before; results in "
          f"{report.out}")
    return 0
