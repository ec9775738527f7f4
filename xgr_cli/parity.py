"""``xgr parity --plan PLAN --data DATA``: run TF and the migrated plan side by side.

``xgr parity --saved_model DIR --data DATA`` compares a SavedModel of ``xgr migrate export``
(its Torch stages inside, as TorchCall) with the TF model it was exported from, in the same
report (``bridge/parity/saved_model.py``; default report folder: ``DIR/../parity_report``).

Compares every stage boundary and the final outputs on each batch of DATA (npz or TFRecord,
see ``bridge/parity/data.py``) with the tolerance table keyed by dtype (ids exact), writes
``parity_report.md`` / ``.html`` with error histograms to ``--report_dir`` and exits with
status 1 when any output is outside its tolerance, so CI can gate each migration step.
A ``tf_keras`` plan runs with TF_USE_LEGACY_KERAS=1, whatever the calling shell sets.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("plan", "migration_plan.json", "Path of the migration plan (JSON).")
flags.DEFINE_string("data", None, "Batches: .npz ('<batch>/<input>' keys) or TFRecord.")
flags.DEFINE_string("report_dir", None, "Where to write the report (default: "
                    "<plan folder>/parity_report).")
flags.DEFINE_integer("batch_size", 32, "Rows per batch when --data is a TFRecord file.")
flags.DEFINE_integer("max_batches", 0, "Compare at most this many batches (0: all).")
flags.DEFINE_string("saved_model", None, "A SavedModel of `xgr migrate export` to compare "
                    "with its TF model instead of a plan.")

_FLAG_NAMES = ("plan", "data", "report_dir", "batch_size", "max_batches", "saved_model")
_LEGACY_ENV = "TF_USE_LEGACY_KERAS"


def plan_keras(plan_path: Path) -> str:
    """The plan's ``keras``, read without importing TensorFlow (which fixes ``tf.keras`` for
    the process); an unreadable plan is reported later, by ``load_plan``."""
    try:
        flavour = json.loads(plan_path.read_text()).get("keras", "keras3")
    except (OSError, ValueError, AttributeError):
        return "keras3"
    return flavour if flavour in ("keras3", "tf_keras") else "keras3"


def saved_model_keras(saved_model: Path) -> str:
    """The Keras of a served migrated model's plan, read without importing TensorFlow."""
    try:
        flavour = json.loads((saved_model / "assets.extra" / "xgr_migration.json").read_text()
                             ).get("keras", "keras3")
    except (OSError, ValueError, AttributeError):
        return "keras3"
    return flavour if flavour in ("keras3", "tf_keras") else "keras3"


def _saved_model_parity() -> int:
    from bridge.parity.data import load_batches
    from bridge.parity.report import write_report
    from bridge.parity.saved_model import read_record, saved_model_parity
    from bridge.migration.stages import build_model
    from xgr_common.errors import XgrError

    saved_model = Path(FLAGS.saved_model)
    try:
        record = read_record(saved_model)
        model = build_model(record["model"], record["keras"])
        batches = load_batches(FLAGS.data, model, FLAGS.batch_size)
        if FLAGS.max_batches > 0:
            batches = batches[: FLAGS.max_batches]
        result = saved_model_parity(saved_model, batches, model)
    except XgrError as error:
        print(f"xgr parity: {error}", file=sys.stderr)
        return 1
    report_dir = (Path(FLAGS.report_dir) if FLAGS.report_dir
                  else saved_model.resolve().parent / "parity_report")
    md_path = write_report(result, report_dir, f"Parity of SavedModel {saved_model.name} "
                                               f"({record['model']})")
    print(result.summary())
    print(f"report: {md_path} and {md_path.with_suffix('.html')}")
    return 0 if result.passed else 1


def main(argv: list[str]) -> int:
    flavour = (saved_model_keras(Path(FLAGS.saved_model)) if FLAGS.saved_model
               else plan_keras(Path(FLAGS.plan)))
    if "tensorflow" not in sys.modules:   # tf.keras is fixed when TF is imported: set it now
        if flavour == "tf_keras":
            os.environ[_LEGACY_ENV] = "1"
        else:
            os.environ.pop(_LEGACY_ENV, None)
    from bridge.migration.keras_flavours import process_flavour, rerun_in_child
    from bridge.migration.plan import load_plan
    from bridge.migration.runner import PlanRunner
    from bridge.parity.data import load_batches
    from bridge.parity.harness import run_parity
    from bridge.parity.report import write_report
    from xgr_common.errors import XgrError

    if len(argv) > 1:
        print(f"xgr parity: unexpected arguments {argv[1:]}", file=sys.stderr)
        return 2
    if not FLAGS.data:
        print("xgr parity: --data is required (npz or TFRecord batches)", file=sys.stderr)
        return 2
    if process_flavour() != flavour:
        present = [FLAGS[name].serialize() for name in _FLAG_NAMES if FLAGS[name].present]
        return rerun_in_child("parity", argv[1:], present, flavour)
    if FLAGS.saved_model:
        return _saved_model_parity()
    plan_path = Path(FLAGS.plan)
    try:
        plan = load_plan(plan_path)
        runner = PlanRunner(plan, plan_path.parent)
        batches = load_batches(FLAGS.data, runner.model, FLAGS.batch_size)
        if FLAGS.max_batches > 0:
            batches = batches[: FLAGS.max_batches]
        result = run_parity(runner, batches)
    except XgrError as error:
        print(f"xgr parity: {error}", file=sys.stderr)
        return 1
    report_dir = Path(FLAGS.report_dir) if FLAGS.report_dir else plan_path.parent / "parity_report"
    md_path = write_report(result, report_dir, f"Parity of {plan_path.name} ({plan.model})")
    print(result.summary())
    print(f"report: {md_path} and {md_path.with_suffix('.html')}")
    return 0 if result.passed else 1
