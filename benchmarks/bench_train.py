"""A fine-tune as a team runs it, at a stated scale: a stand-in checkpoint of a model's shape,
a catalog and a planted behaviour log in, ``xgr train`` then ``xgr evaluate``; throughput, the
loss curve and recall beside the baselines out, in one run.

    python -m benchmarks.bench_train --preset=qwen2-0.5b --device=cuda --users=50000 \\
        --events_per_user=20 --catalog_items=1000 --keep_last=50 --steps=2000 \\
        --batch_size=64 --learning_rate=5e-4 --mixed_precision=bf16 --label=h100
    python -m benchmarks.bench_train    # a CPU smoke run at tiny sizes

1. ``xgr stand_in --preset`` (the preset's layers, heads and widths with random weights; the
   stand-in tokenizer's vocabulary) and ``xgr extend_vocab`` (the token layout, ``--keep_last``
   history items a prompt).
2. A catalog of ``--catalog_items`` items on random 3-level code paths and a planted log of
   ``--users`` x ``--events_per_user`` events: the items form chains of ``--chain`` items,
   each user walks one chain from a random start, one event an hour, and with probability
   ``--noise`` takes a random item instead. A model that learns the chains predicts the next
   item; popularity cannot, co-occurrence can in part. The code paths are random, so each
   step along a chain is a fact to learn from its examples: a run must see each one often
   (steps x batch size over the catalog's items; about 128 times above), and a stand-in of
   random weights needs a rate for training from scratch, not a fine-tune's. At 100,000
   items and 1e-4 the run saw each step about once and its loss stopped at the uniform
   choice among a level's codes.
3. ``xgr train`` (accelerate, ``--mixed_precision``, ``--holdout`` users kept out), then
   ``xgr evaluate`` on the held-out users (recall@K and NDCG@K of the model beside popularity
   and co-occurrence), each a child process as a user runs them.

Reported: events, examples, steps, steps and examples per second, the first and last losses
(means of 20 steps), the loss curve (copied beside the result), recall@10 of each ranker.
Writes ``results/train_<date>_<label>.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import app, flags

from benchmarks import results_file as rf
from benchmarks.serve_process import ROOT, child_env

FLAGS = flags.FLAGS
flags.DEFINE_string("preset", "tiny", "Shape of the stand-in model (xgr stand_in --preset).")
flags.DEFINE_integer("users", 200, "Users of the planted log.")
flags.DEFINE_integer("events_per_user", 12, "Events of each user.")
flags.DEFINE_integer("catalog_items", 300, "Catalog items.")
flags.DEFINE_integer("chain", 60, "Items per chain of the planted pattern.")
flags.DEFINE_float("noise", 0.1, "Share of events that take a random item instead.")
flags.DEFINE_integer("keep_last", 10, "History items a prompt keeps (xgr extend_vocab).")
flags.DEFINE_integer("steps", 60, "xgr train --steps.")
flags.DEFINE_integer("batch_size", 16, "xgr train --batch_size.")
flags.DEFINE_float("learning_rate", 3e-3, "xgr train --learning_rate.")
flags.DEFINE_integer("warmup_steps", 5, "xgr train --warmup_steps.")
flags.DEFINE_integer("checkpoint_every", 500, "xgr train --checkpoint_every.")
flags.DEFINE_float("max_train_seconds", 0.0, "xgr train --max_train_seconds (0: no limit): "
                   "the steps stop there and the result records how many ran.")
flags.DEFINE_enum("mixed_precision", "no", ["no", "bf16", "fp16"], "xgr train --mixed_precision.")
flags.DEFINE_enum("device", "cpu", ["cpu", "cuda"], "Where training and evaluation run.")
flags.DEFINE_float("holdout", 0.1, "Users kept out of training and evaluated.")
flags.DEFINE_bool("evaluate", True, "Run xgr evaluate on the held-out users afterwards.")
flags.DEFINE_integer("max_requests", 200, "xgr evaluate --max_requests.")
flags.DEFINE_integer("beam_width", 16, "xgr evaluate --beam_width.")
flags.DEFINE_integer("top_k", 10, "xgr evaluate --top_k (the beam reaches at most beam_width "
                     "items where each path holds one).")
flags.DEFINE_string("work", None, "Working folder (default: a temporary one, removed).")
flags.DEFINE_string("label", "cpu", "Device label of the result file.")
flags.DEFINE_string("out_dir", os.path.join(ROOT, "benchmarks", "results"), "Result folder.")


def planted_log(rng: np.random.Generator, ids: np.ndarray) -> tuple[np.ndarray, ...]:
    """(users, items, times) of the planted pattern (see the module docstring, step 2)."""
    chains = max(len(ids) // FLAGS.chain, 1)
    users = np.repeat(np.arange(FLAGS.users), FLAGS.events_per_user)
    chain = rng.integers(0, chains, FLAGS.users)[users]
    start = rng.integers(0, FLAGS.chain, FLAGS.users)[users]
    step = np.tile(np.arange(FLAGS.events_per_user), FLAGS.users)
    items = ids[chain * FLAGS.chain + (start + step) % FLAGS.chain]
    noisy = rng.random(len(items)) < FLAGS.noise
    items[noisy] = rng.choice(ids, int(noisy.sum()))
    times = 1_700_000_000 + 3600 * step
    return users, items, times


def xgr(log: Path, *args: str) -> float:
    """Runs one ``xgr`` command as a child process (its output to ``log``); its wall time.
    A failure stops the benchmark with the command's last words."""
    started = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run([sys.executable, "-m", "xgr_cli.main", *args], cwd=ROOT,
                              env=child_env(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1"),
                              stdout=out, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"xgr {args[0]} failed (rc {done.returncode}):\n"
                           f"{log.read_text()[-3000:]}")
    return time.perf_counter() - started


def main(argv: list[str]) -> None:
    del argv
    from xgr_checkpoint.catalog_file import write_catalog
    from xgr_train.logs import write_logs

    rng = np.random.default_rng(0)
    work = Path(FLAGS.work or tempfile.mkdtemp(prefix="xgr_train_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"stand-in {FLAGS.preset} and its layout ...", flush=True)
    seconds = {"stand_in": xgr(work / "stand_in.log", "stand_in", f"--out={work / 'base'}",
                               f"--preset={FLAGS.preset}")}
    seconds["extend_vocab"] = xgr(work / "extend_vocab.log", "extend_vocab",
                                  f"--model={work / 'base'}", f"--out={work / 'model'}",
                                  f"--keep_last={FLAGS.keep_last}")
    shutil.rmtree(work / "base")
    ids = rng.choice(np.arange(1000, 1000 + 20 * FLAGS.catalog_items), FLAGS.catalog_items,
                     replace=False).astype(np.int64)
    codes = rng.integers(0, 256, (FLAGS.catalog_items, 3)).astype(np.int32)
    write_catalog(work / "catalog.parquet", ids, codes)
    users, items, times = planted_log(rng, ids)
    write_logs(work / "log.parquet", users, items, times, np.full(len(users), "us"))
    print(f"{len(users):,} events of {FLAGS.users:,} users; training {FLAGS.steps} steps of "
          f"{FLAGS.batch_size} on {FLAGS.device} ...", flush=True)
    common = [f"--model={work / 'model'}", f"--catalog={work / 'catalog.parquet'}",
              f"--logs={work / 'log.parquet'}", f"--holdout={FLAGS.holdout}"]
    seconds["train"] = xgr(work / "train.log", "train", *common, f"--out={work / 'trained'}",
                           f"--steps={FLAGS.steps}", f"--batch_size={FLAGS.batch_size}",
                           f"--learning_rate={FLAGS.learning_rate}",
                           f"--warmup_steps={FLAGS.warmup_steps}",
                           f"--checkpoint_every={FLAGS.checkpoint_every}",
                           f"--mixed_precision={FLAGS.mixed_precision}",
                           f"--device={FLAGS.device}",
                           f"--max_train_seconds={FLAGS.max_train_seconds}")
    report = json.loads((work / "trained" / "train_report.json").read_text())
    losses = report["losses"]
    head = float(np.mean(losses[:20]))
    tail = float(np.mean(losses[-20:]))
    evaluation = None
    if FLAGS.evaluate:
        print("evaluating the held-out users ...", flush=True)
        seconds["evaluate"] = xgr(
            work / "evaluate.log", "evaluate", f"--model={work / 'trained' / 'model'}",
            f"--catalog={work / 'catalog.parquet'}", f"--logs={work / 'log.parquet'}",
            f"--feature_graph={work / 'trained' / 'tower.safetensors'}",
            f"--holdout={FLAGS.holdout}", f"--out={work / 'evaluation'}",
            f"--max_requests={FLAGS.max_requests}", f"--beam_width={FLAGS.beam_width}",
            f"--top_k={FLAGS.top_k}", "--k=1,10", f"--device={FLAGS.device}",
            "--noprogress")
        evaluation = json.loads((work / "evaluation" / "evaluation.json").read_text())
    Path(FLAGS.out_dir).mkdir(parents=True, exist_ok=True)
    result = rf.result_path(FLAGS.out_dir, "train", FLAGS.label)
    curve = result.with_name(f"{result.stem}_loss.png")
    shutil.copyfile(work / "trained" / "loss.png", curve)
    examples_per_second = FLAGS.batch_size * report["steps_per_second"]
    print(f"\n{FLAGS.preset} stand-in, {len(users):,} events, {report['examples']:,} examples "
          f"of {report['users']:,} users, {FLAGS.mixed_precision} on {report['device']}")
    print(f"{'steps':>7}{'steps/s':>9}{'examples/s':>12}{'first loss':>12}{'last loss':>11}")
    print(f"{len(losses):>7}{report['steps_per_second']:>9.2f}{examples_per_second:>12.1f}"
          f"{head:>12.3f}{tail:>11.3f}")
    recall = {}
    if evaluation:
        recall = {name: by_k.get("10") for name, by_k in evaluation["recall"].items()}
        print("recall@10: " + ", ".join(f"{k} {v:.3f}" for k, v in recall.items()
                                        if v is not None))
    path = rf.write_result(FLAGS.out_dir, "train", {
        "date": rf.utc_now(), "preset": FLAGS.preset, "device": report["device"],
        "mixed_precision": FLAGS.mixed_precision, "events": int(len(users)),
        "users": FLAGS.users, "catalog_items": FLAGS.catalog_items, "chain": FLAGS.chain,
        "noise": FLAGS.noise, "keep_last": FLAGS.keep_last, "steps": len(losses),
        "steps_asked": FLAGS.steps, "max_train_seconds": FLAGS.max_train_seconds,
        "stopped_at_time_limit": bool(report.get("stopped_at_time_limit")),
        "batch_size": FLAGS.batch_size, "learning_rate": FLAGS.learning_rate,
        "examples": report["examples"], "train_users": report["users"],
        "steps_per_second": report["steps_per_second"],
        "examples_per_second": examples_per_second, "first_loss": head, "last_loss": tail,
        "losses": losses, "loss_curve": curve.name, "seconds": seconds,
        "recall_at_10": recall, "evaluation": evaluation}, FLAGS.label)
    print(f"result: {path}  loss curve: {curve}")
    if not FLAGS.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
