"""``xgr migrate ACTION [STAGE ...] --plan PLAN``: show or change a migration plan.

Actions:
  init                      create a plan for ``--model pkg.mod:function`` (all stages in TF)
  status                    list the model's stages and where each runs
  swap STAGE --module M     run STAGE as Torch module ``M`` (``pkg.mod:Class``; built with
                            ``Class.from_keras_layer(layer)`` when defined, else
                            ``Class(**--kwargs)``)
  revert STAGE              run STAGE in TF again
  auto [STAGE ...]          convert stages automatically (tf2onnx -> ONNX -> Torch); without
                            stages, every stage now in TF. Unconvertible stages are reported
                            together with their reasons and stay in TF (exit status 1).
                            ``--dry_run`` reports without changing the plan.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from absl import flags

from bridge.migration.plan import MigrationPlan, StagePlan, load_plan, save_plan
from xgr_common.errors import MigrationError

FLAGS = flags.FLAGS
flags.DEFINE_string("plan", "migration_plan.json", "Path of the migration plan (JSON).")
flags.DEFINE_string("model", None, "init: the model factory, pkg.mod:function.")
flags.DEFINE_string("module", None, "swap: the Torch module class, pkg.mod:Class.")
flags.DEFINE_string("kwargs", "{}", "swap: JSON object of constructor arguments.")
flags.DEFINE_string("data", None, "auto: batches (npz/TFRecord) whose inputs check conversions.")
flags.DEFINE_integer("batch_size", 32, "auto: rows per batch when --data is a TFRecord file.")
flags.DEFINE_bool("dry_run", False, "auto: report what converts without changing the plan.")
flags.DEFINE_bool("force", False, "init: overwrite an existing plan.")

ACTIONS = ("init", "status", "swap", "revert", "auto")


def _status(plan: MigrationPlan, plan_path: Path) -> int:
    from bridge.migration.stages import StagedModel, build_model

    staged = StagedModel(build_model(plan.model))
    plan.check_stages_exist(staged.names)
    rows = [("stage", "layer", "runtime", "torch source")]
    for name in staged.names:
        stage = plan.stage(name)
        rows.append((name, type(staged.layer(name)).__name__, stage.runtime,
                     stage.module or stage.converted or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    print(f"plan {plan_path} (model {plan.model}): "
          f"{len(plan.torch_stages())} of {len(staged.names)} stages in Torch")
    for row in rows:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    return 0


def _swap(plan: MigrationPlan, plan_path: Path, stage: str, module: str, kwargs: str) -> int:
    from bridge.migration.runner import PlanRunner

    try:
        parsed = json.loads(kwargs)
    except json.JSONDecodeError as error:
        raise MigrationError(f"--kwargs must be a JSON object: {error}") from None
    new_plan = plan.with_stage(StagePlan(stage, "torch", module=module, kwargs=parsed))
    PlanRunner(new_plan, plan_path.parent)   # builds every Torch stage: fails before saving
    save_plan(new_plan, plan_path)
    print(f"{stage}: now runs in Torch as {module}; check it with "
          f"`xgr parity --plan {plan_path} --data BATCHES`")
    return 0


def _auto(plan: MigrationPlan, plan_path: Path, stages: list[str]) -> int:
    from bridge.migration.auto import auto_migrate
    from bridge.migration.convert import format_reasons
    from bridge.migration.stages import StagedModel, build_model
    from bridge.parity.data import load_batches

    model = build_model(plan.model)
    names = stages or [n for n in StagedModel(model).names if plan.stage(n).runtime == "tf"]
    batch = load_batches(FLAGS.data, model, FLAGS.batch_size)[0] if FLAGS.data else None
    if FLAGS.dry_run:
        from bridge.migration.convert import convert_stages
        results = convert_stages(model, names, batch, progress=True)
    else:
        plan, results = auto_migrate(plan, plan_path.parent, model, names, batch, progress=True)
        save_plan(plan, plan_path)
    for result in results:
        if result.ok:
            verb = "converts" if FLAGS.dry_run else "converted, now runs in Torch"
            print(f"{result.name}: {verb}")
    failed = [r for r in results if not r.ok]
    if failed:
        print(f"\n{len(failed)} of {len(results)} stages cannot convert and stay in TF:\n"
              + format_reasons(results))
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    args = argv[1:]
    if not args or args[0] not in ACTIONS:
        print(f"usage: xgr migrate {{{'|'.join(ACTIONS)}}} [STAGE ...] --plan PLAN\n\n{__doc__}",
              file=sys.stderr)
        return 2
    action, rest = args[0], args[1:]
    plan_path = Path(FLAGS.plan)
    try:
        if action == "init":
            if plan_path.exists() and not FLAGS.force:
                raise MigrationError(f"{plan_path} exists; pass --force to overwrite it")
            if not FLAGS.model:
                raise MigrationError("init needs --model pkg.mod:function")
            save_plan(MigrationPlan(model=FLAGS.model), plan_path)
            return _status(load_plan(plan_path), plan_path)
        plan = load_plan(plan_path)
        if action == "status":
            return _status(plan, plan_path)
        if action == "auto":
            return _auto(plan, plan_path, rest)
        if len(rest) != 1:
            raise MigrationError(f"{action} takes exactly one STAGE, got {rest}")
        if action == "revert":
            save_plan(plan.with_stage(StagePlan(rest[0])), plan_path)
            print(f"{rest[0]}: runs in TF again")
            return 0
        if not FLAGS.module:
            raise MigrationError("swap needs --module pkg.mod:Class")
        return _swap(plan, plan_path, rest[0], FLAGS.module, FLAGS.kwargs)
    except MigrationError as error:
        print(f"xgr migrate {action}: {error}", file=sys.stderr)
        return 1
