"""``xgr train --model DIR --catalog FILE --logs FILE --out DIR``: fine-tune a team's
checkpoint on its behaviour log (``xgr_train.train``). Writes ``OUT/model`` and
``OUT/tower.safetensors`` for ``xgr export``, the report and the loss curve; a run into a
folder with checkpoints resumes from the last one."""

from __future__ import annotations

from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "Hugging Face Qwen2/Qwen3 folder with the token layout in "
                    "its vocabulary and its xgr_model.json (`xgr extend_vocab`).")
flags.DEFINE_string("catalog", None, "The catalog file (Parquet or .npz) of item code paths.")
flags.DEFINE_string("logs", None, "The behaviour log (Parquet: user, item, timestamp, optional "
                    "context).")
flags.DEFINE_string("out", None, "Output folder (model, tower, report, checkpoints).")
flags.DEFINE_string("feature_graph", None, "The feature graph's trained weights to start the "
                    "profile tower from (.safetensors); default: a fresh tower.")
flags.DEFINE_integer("steps", 1000, "Optimiser steps.")
flags.DEFINE_integer("batch_size", 32, "Examples per step.")
flags.DEFINE_float("learning_rate", 1e-4, "Peak learning rate of the model.")
flags.DEFINE_float("tower_learning_rate", 3e-3, "Peak learning rate of the profile tower.")
flags.DEFINE_integer("warmup_steps", 50, "Linear warm-up steps before the cosine decay.")
flags.DEFINE_integer("examples_per_user", 8, "Each user's last N events become examples.")
flags.DEFINE_float("holdout", 0.0, "Share of users kept out (those `xgr evaluate --split "
                   "users` holds out with the same --seed).")
flags.DEFINE_integer("train_before", None, "Train only on events before this unix time "
                     "(`xgr evaluate --split time` tests what follows).")
flags.DEFINE_enum("mixed_precision", "no", ["no", "bf16", "fp16"], "accelerate's mixed "
                  "precision.")
flags.DEFINE_integer("lora_rank", 0, "LoRA adapters of this rank on the projections (peft) "
                     "instead of a full fine-tune; 0: full.")
flags.DEFINE_integer("checkpoint_every", 200, "Steps between checkpoints (resumable).")
flags.DEFINE_float("max_train_seconds", 0.0, "Stop the steps after this long, at a checkpoint "
                   "(0: no limit); running the same command again goes on from there.")
flags.DEFINE_enum("device", "auto", ["auto", "cpu", "cuda"], "Where to train.")
flags.DEFINE_integer("seed", 0, "Seed of the batches, the holdout and the fresh tower.")
for name in ("model", "catalog", "logs", "out"):
    flags.mark_flag_as_required(name)


def main(argv: list[str]) -> int:
    del argv
    from xgr_train.train import FineTuneConfig, fine_tune

    config = FineTuneConfig(
        model=FLAGS.model, catalog=FLAGS.catalog, logs=FLAGS.logs, out=FLAGS.out,
        feature_graph=FLAGS.feature_graph, steps=FLAGS.steps, batch_size=FLAGS.batch_size,
        learning_rate=FLAGS.learning_rate, tower_learning_rate=FLAGS.tower_learning_rate,
        warmup_steps=FLAGS.warmup_steps, examples_per_user=FLAGS.examples_per_user,
        holdout=FLAGS.holdout, train_before=FLAGS.train_before,
        mixed_precision=FLAGS.mixed_precision, lora_rank=FLAGS.lora_rank,
        checkpoint_every=FLAGS.checkpoint_every, device=FLAGS.device, seed=FLAGS.seed,
        max_train_seconds=FLAGS.max_train_seconds)
    report = fine_tune(config)
    losses = report.losses
    window = max(1, min(25, len(losses) // 4))
    resumed = f" (resumed at step {report.resumed_from})" if report.resumed_from else ""
    stopped = (f" (stopped at the time limit: run it again to go on to step {FLAGS.steps})"
               if report.stopped_at_time_limit else "")
    print(f"trained {len(losses) - report.resumed_from} steps{resumed}{stopped} on "
          f"{report.examples} examples of {report.users} users "
          f"({report.dropped_events} events outside the catalog dropped), "
          f"{report.steps_per_second:.1f} steps/s on {report.device}\n"
          f"  loss {sum(losses[:window]) / window:.3f} -> "
          f"{sum(losses[-window:]) / window:.3f} (mean of {window} steps); curve {report.plot}\n"
          f"  export it: xgr export --model {report.model} --catalog {FLAGS.catalog} "
          f"--feature_graph {report.feature_graph} --out DIR")
    return 0
