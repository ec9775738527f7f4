"""``xgr evaluate``: a team's model against popularity and co-occurrence on its behaviour log.

    xgr evaluate --model CHECKPOINT --catalog catalog.parquet \\
        --feature_graph feature_graph.safetensors --logs events.parquet --out DIR

(the three files ``xgr export`` takes, and a Parquet log of ``user``, ``item``, ``timestamp``
and optionally ``context``). ``--split users`` tests the users a seeded ``--holdout`` share
leaves out (as ``xgr train`` with the same ``--holdout`` and ``--seed``); ``--split time``
tests the day from ``--test_from`` (default: the log's last day), the baselines counting only
the events before it. Turns the flags into an ``xgr_train.evaluate.EvaluateConfig``, runs
``evaluate_logs``, prints the table and writes ``DIR/evaluation.json`` and
``DIR/evaluation.png``. Exit 1 with the file and the rule on a bad input.
"""

from __future__ import annotations

from absl import flags

from xgr_common.errors import ConfigError

FLAGS = flags.FLAGS
flags.DEFINE_string("model", None, "Hugging Face Qwen2/Qwen3 folder with its xgr_model.json.")
flags.DEFINE_string("catalog", None, "The catalog file (.parquet or .npz, "
                    "docs/catalog_file.md).")
flags.DEFINE_string("feature_graph", None, "The trained feature graph: the reference graph's "
                    "weights (.safetensors) or a SavedModel folder.")
flags.DEFINE_string("logs", None, "The behaviour log (Parquet: user, item, timestamp as "
                    "integers, optional context string).")
flags.DEFINE_string("out", None, "Folder for evaluation.json and evaluation.png (created); "
                    "unset: the table only.")
flags.DEFINE_enum("split", "users", ["users", "time"], "users: test the held-out users' last "
                  "events; time: train on the past, test on the day from --test_from.")
flags.DEFINE_float("holdout", 0.1, "--split users: the share of users held out (pass xgr "
                   "train's --holdout and --seed to test the users it left out).")
flags.DEFINE_integer("seed", 0, "Seed of the held-out users and of the --max_requests sample.")
flags.DEFINE_integer("events_per_user", 1, "--split users: each held-out user's last N events "
                     "are requests.", lower_bound=1)
flags.DEFINE_integer("test_from", None, "--split time: unix seconds where the test period "
                     "starts (the baselines count only earlier events); default: the start "
                     "(00:00 UTC) of the log's last day.")
flags.DEFINE_integer("test_days", 1, "--split time: days tested from --test_from.",
                     lower_bound=1)
flags.DEFINE_list("k", ["1", "5", "10", "20", "50", "100"], "K values of recall@K and NDCG@K "
                  "(each <= --top_k).")
flags.DEFINE_integer("beam_width", 128, "Beams kept per code level.")
flags.DEFINE_integer("top_k", 100, "Items per list (the engine's and the baselines').")
flags.DEFINE_integer("batch_size", 64, "Requests per pipeline call.")
flags.DEFINE_integer("max_requests", 10000, "At most this many test requests (a seeded "
                     "sample); 0: all.", lower_bound=0)
flags.DEFINE_integer("cooccurrence_items", 1, "The co-occurrence baseline looks at what "
                     "followed the request's last N items (weights 1, 1/2, ...).",
                     lower_bound=1)
flags.DEFINE_list("blocked_items", [], "Item ids the business rules never show (all rankers).")
flags.DEFINE_integer("max_per_category", 0, "Business rule: at most this many items per "
                     "top-level category in a list (0 = no cap).", lower_bound=0)
flags.DEFINE_string("device", "cpu", "Device of the engine: cpu or cuda[:i].")
flags.DEFINE_enum("dtype", None, ["float32", "bfloat16", "float16"], "Engine weights and "
                  "activations; default bfloat16 on CUDA, float32 on the CPU.")
flags.DEFINE_bool("progress", True, "Show a progress bar.")


def _ints(name: str, values: list[str]) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in values)
    except ValueError:
        raise ConfigError(f"--{name} must be comma-separated integers, got "
                          f"{','.join(values)!r}") from None


def config_from_flags():
    from tf_frontend.rules import BusinessRules
    from xgr_train.evaluate import DAY, EvaluateConfig

    missing = [f"--{name}" for name in ("model", "catalog", "feature_graph", "logs")
               if not getattr(FLAGS, name)]
    if missing:
        raise ConfigError(f"xgr evaluate needs {', '.join(missing)} (the model, catalog and "
                          f"feature graph xgr export takes, and the behaviour log)")
    return EvaluateConfig(
        model=FLAGS.model, catalog=FLAGS.catalog, feature_graph=FLAGS.feature_graph,
        logs=FLAGS.logs, out=FLAGS.out, split=FLAGS.split, holdout=FLAGS.holdout,
        seed=FLAGS.seed, events_per_user=FLAGS.events_per_user, test_from=FLAGS.test_from,
        test_seconds=FLAGS.test_days * DAY, ks=tuple(sorted(set(_ints("k", FLAGS.k)))),
        beam_width=FLAGS.beam_width, top_k=FLAGS.top_k, batch_size=FLAGS.batch_size,
        max_requests=FLAGS.max_requests or None, cooccurrence_items=FLAGS.cooccurrence_items,
        rules=BusinessRules(blocked_items=_ints("blocked_items", FLAGS.blocked_items),
                            max_per_category=FLAGS.max_per_category or None),
        device=FLAGS.device, dtype=FLAGS.dtype)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise ConfigError(f"xgr evaluate takes flags only, got {argv[1:]}")
    config = config_from_flags()
    from xgr_train.evaluate import evaluate_logs

    report = evaluate_logs(config, progress=FLAGS.progress)
    print(report.table())
    print(f"pipeline {report.ms_per_request:.2f} ms a request on {report.device}; "
          f"{report.seconds:.1f} s in all")
    for name, path in report.files.items():
        print(f"wrote {name}: {path}")
    return 0
