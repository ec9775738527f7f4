"""``xgr migrate ACTION [STAGE ...] --plan PLAN``: show or change a migration plan.

Actions:
  init                      create a plan for ``--model pkg.mod:function`` (all stages in TF);
                            builds the model first and writes nothing if it has no stages.
                            ``--keras tf_keras`` for Keras 2 models (default: ``tf_keras`` when
                            TF_USE_LEGACY_KERAS=1 is set, else ``keras3``)
  status                    list the model's stages and where each runs
  swap STAGE --module M     run STAGE as Torch module ``M`` (``pkg.mod:Class``; built with
                            ``Class.from_keras_layer(layer)`` when defined, else
                            ``Class(**--kwargs)``)
  revert STAGE              run STAGE in TF again
  auto [STAGE ...]          convert stages automatically (tf2onnx -> ONNX -> Torch); without
                            stages, every stage now in TF. Unconvertible stages are reported
                            together with their reasons and stay in TF (exit status 1).
                            ``--dry_run`` reports without changing the plan.
  assemble --out DIR        once every stage runs in Torch: one nn.Module of the whole model,
                            exported with torch.export to DIR/model.pt2 (the first batch of
                            --data is the example; open dimensions stay dynamic) beside its
                            weights (DIR/weights.safetensors); checked against TF on --data
  export --out DIR          at any step: one SavedModel with the model's serving signature,
                            each Torch stage inside as a TorchCall on its own torch.export +
                            AOTInductor package (the stage's inputs on the first batch of
                            --data are its example); --device / --devices place the stages
                            (cpu or cuda:N), --ragged names row-splits inputs and their values;
                            reloaded in a fresh process (TF + custom_ops) and checked against
                            TF on the first batch. Serve it with `xgr serve`; compare it on
                            all of --data with `xgr parity --saved_model DIR`

Each plan runs in the process its Keras needs: a ``tf_keras`` plan runs with
TF_USE_LEGACY_KERAS=1, whatever the calling shell sets.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("plan", "migration_plan.json", "Path of the migration plan (JSON).")
flags.DEFINE_string("model", None, "init: the model factory, pkg.mod:function.")
flags.DEFINE_enum("keras", None, ["keras3", "tf_keras"],
                  "init: the Keras the model is written in (default: tf_keras when "
                  "TF_USE_LEGACY_KERAS=1 is set, else keras3).")
flags.DEFINE_string("module", None, "swap: the Torch module class, pkg.mod:Class.")
flags.DEFINE_string("kwargs", "{}", "swap: JSON object of constructor arguments.")
flags.DEFINE_string("data", None, "auto: batches (npz/TFRecord) whose inputs check conversions.")
flags.DEFINE_integer("batch_size", 32, "auto: rows per batch when --data is a TFRecord file.")
flags.DEFINE_bool("dry_run", False, "auto: report what converts without changing the plan.")
flags.DEFINE_bool("force", False, "init: overwrite an existing plan.")
flags.DEFINE_string("out", None, "assemble: folder for model.pt2 and weights.safetensors; "
                    "export: the new SavedModel's folder.")
flags.DEFINE_string("device", "cpu", "export: where the Torch stages run (cpu or cuda:N).")
flags.DEFINE_string("devices", "{}", "export: JSON object stage -> device for stages that run "
                    "elsewhere than --device.")
flags.DEFINE_string("ragged", "{}", "export: JSON object row-splits input -> list of the value "
                    "inputs it partitions (the server batches them as one ragged group).")
flags.DEFINE_string("cache_dir", None, "export: reuse compiled stage packages kept here.")
flags.DEFINE_bool("verify", True, "export: reload the SavedModel in a fresh process and "
                  "compare it with TF on the first batch of --data.")

ACTIONS = ("init", "status", "swap", "revert", "auto", "assemble", "export")
_FLAG_NAMES = ("plan", "model", "keras", "module", "kwargs", "data", "batch_size", "dry_run",
               "force", "out", "device", "devices", "ragged", "cache_dir", "verify")
_LEGACY_ENV = "TF_USE_LEGACY_KERAS"


def wanted_keras(action: str, plan_path: Path) -> str:
    """The Keras this command's model needs, read without importing TensorFlow (which fixes
    ``tf.keras`` for the process): ``--keras`` or the environment for ``init``, else the
    plan's ``keras`` (an unreadable plan is reported later, by ``load_plan``)."""
    if action == "init":
        if FLAGS.keras:
            return FLAGS.keras
        legacy = os.environ.get(_LEGACY_ENV, "").strip().lower() in ("1", "true", "yes")
        return "tf_keras" if legacy else "keras3"
    try:
        flavour = json.loads(plan_path.read_text()).get("keras", "keras3")
    except (OSError, ValueError, AttributeError):
        return "keras3"
    return flavour if flavour in ("keras3", "tf_keras") else "keras3"


def _status(plan, plan_path: Path, model=None) -> int:
    from bridge.migration.stages import StagedModel, build_model

    staged = StagedModel(model if model is not None else build_model(plan.model, plan.keras))
    plan.check_stages_exist(staged.names)
    rows = [("stage", "layer", "inputs from", "runtime", "torch source")]
    for name in staged.names:
        stage = plan.stage(name)
        rows.append((name, type(staged.layer(name)).__name__,
                     ", ".join(staged.sources(name)) or "-", stage.runtime,
                     stage.module or stage.converted or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"plan {plan_path} (model {plan.model}, {plan.keras}): "
          f"{len(plan.torch_stages())} of {len(staged.names)} stages in Torch")
    for row in rows:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)))
    return 0


def _init(plan_path: Path, flavour: str) -> int:
    from bridge.migration.keras_flavours import flavour_of
    from bridge.migration.plan import MigrationPlan, save_plan
    from bridge.migration.stages import build_model
    from xgr_common.errors import MigrationError

    if plan_path.exists() and not FLAGS.force:
        raise MigrationError(f"{plan_path} exists; pass --force to overwrite it")
    if not FLAGS.model:
        raise MigrationError("init needs --model pkg.mod:function")
    plan = MigrationPlan(model=FLAGS.model, keras=flavour)   # checks the spec's form
    try:
        model = build_model(plan.model)   # checked before anything is written
    except MigrationError as error:
        hint = "" if FLAGS.keras else (
            "; a tf.keras model written for Keras 2 needs --keras tf_keras"
            if flavour == "keras3" else "")
        raise MigrationError(f"{error}{hint}") from None
    built = flavour_of(model)
    if built != flavour and FLAGS.keras:
        raise MigrationError(f"--keras {flavour}: the factory built a {built} model")
    plan = MigrationPlan(model=plan.model, keras=built)
    save_plan(plan, plan_path)
    return _status(plan, plan_path, model)


def _swap(plan, plan_path: Path, stage: str, module: str, kwargs: str) -> int:
    from bridge.migration.plan import StagePlan, save_plan
    from bridge.migration.runner import PlanRunner
    from xgr_common.errors import MigrationError

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


def _revert(plan, plan_path: Path, stage: str) -> int:
    from bridge.migration.plan import StagePlan, save_plan
    from bridge.migration.stages import StagedModel, build_model
    from xgr_common.errors import MigrationError

    if plan.stage(stage).runtime == "tf":
        names = StagedModel(build_model(plan.model, plan.keras)).names
        if stage not in names:
            raise MigrationError(f"the model has no stage {stage!r}; its stages are {names}")
        print(f"{stage}: already runs in TF")
        return 0
    save_plan(plan.with_stage(StagePlan(stage)), plan_path)
    print(f"{stage}: runs in TF again")
    return 0


def _auto(plan, plan_path: Path, stages: list[str]) -> int:
    from bridge.migration.auto import auto_migrate
    from bridge.migration.convert import convert_stages, format_reasons
    from bridge.migration.plan import save_plan
    from bridge.migration.stages import StagedModel, build_model
    from bridge.parity.data import load_batches

    model = build_model(plan.model, plan.keras)
    names = stages or [n for n in StagedModel(model).names if plan.stage(n).runtime == "tf"]
    batch = load_batches(FLAGS.data, model, FLAGS.batch_size)[0] if FLAGS.data else None
    if FLAGS.dry_run:
        results = convert_stages(model, names, batch, progress=True)
    else:
        plan, results = auto_migrate(plan, plan_path.parent, model, names, batch, progress=True)
        save_plan(plan, plan_path)
    for result in results:
        if result.ok:
            verb = "converts" if FLAGS.dry_run else "converted, now runs in Torch"
            print(f"{result.name}: {verb}{result.notes_text()}")
    failed = [r for r in results if not r.ok]
    if failed:
        print(f"\n{len(failed)} of {len(results)} stages cannot convert and stay in TF:\n"
              + format_reasons(results))
    return 1 if failed else 0


def _assemble(plan, plan_path: Path) -> int:
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from bridge.migration.assemble import assemble, example_inputs, export_assembled
    from bridge.migration.stages import StagedModel, build_model
    from bridge.parity.data import load_batches
    from xgr_common.errors import MigrationError

    if not FLAGS.out or not FLAGS.data:
        raise MigrationError("assemble needs --out DIR and --data BATCHES (the example inputs "
                             "and the check against TF)")
    model = build_model(plan.model, plan.keras)
    assembled = assemble(plan, plan_path.parent, model)
    batches = load_batches(FLAGS.data, model, FLAGS.batch_size)
    program = export_assembled(assembled, example_inputs(assembled, batches[0]))
    out = Path(FLAGS.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(out / "model.pt2"))
    save_file({k: v.detach().clone().contiguous() for k, v in assembled.state_dict().items()},
              str(out / "weights.safetensors"))
    worst, staged = 0.0, StagedModel(model)
    for batch in batches:
        expected = [v.numpy() for _, v in staged.run(batch)[0]]
        got = program.module()(*example_inputs(assembled, batch))
        got = got if isinstance(got, tuple) else (got,)
        worst = max([worst] + [float(np.max(np.abs(g.detach().numpy() - e)))
                               for g, e in zip(got, expected)])
    print(f"assembled {len(assembled.wiring)} stages into {out / 'model.pt2'} "
          f"({sum(p.numel() for p in assembled.parameters())} weights in "
          f"{out / 'weights.safetensors'}); max abs err against TF on {len(batches)} batches: "
          f"{worst:.3g}")
    return 0


def _json_flag(name: str) -> dict:
    from xgr_common.errors import ConfigError

    try:
        value = json.loads(FLAGS[name].value)
    except json.JSONDecodeError as error:
        raise ConfigError(f"--{name} must be a JSON object: {error}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--{name} must be a JSON object, got {FLAGS[name].value!r}")
    return value


def _export(plan_path: Path) -> int:
    from xgr_common.errors import ConfigError
    from xgr_export.migrated_model import MigratedExportConfig, export_migrated

    if not FLAGS.out or not FLAGS.data:
        raise ConfigError("export needs --out DIR and --data BATCHES (the stages' example "
                          "inputs and the check against TF)")
    ragged = _json_flag("ragged")
    if not all(isinstance(v, list) for v in ragged.values()):
        raise ConfigError(f"--ragged must map a splits input to a list of value inputs, got "
                          f"{FLAGS.ragged!r}")
    report = export_migrated(MigratedExportConfig(
        plan=plan_path, out=FLAGS.out, data=FLAGS.data, device=FLAGS.device,
        devices=_json_flag("devices"), ragged={k: tuple(v) for k, v in ragged.items()},
        cache_dir=FLAGS.cache_dir, batch_size=FLAGS.batch_size, verify=FLAGS.verify),
        progress=lambda line: print(line, flush=True))
    for stage in report.torch_stages:
        print(f"  {stage.name}: TorchCall on {stage.package} ({stage.device}, "
              f"{stage.seconds:.1f} s)")
    print(f"  TF stages: {', '.join(report.tf_stages) or 'none'}")
    for row in report.verified:
        verdict = "pass" if row["passed"] else f"FAIL: {row['problem']}"
        print(f"  {row['output']}: max abs err {row['max_abs_err']:.3g} against TF ({verdict})")
    if report.forbidden_modules:
        print(f"  the reloaded SavedModel needed {list(report.forbidden_modules)}")
    print(f"exported {report.saved_model}: {len(report.torch_stages)} Torch stages, "
          f"{len(report.tf_stages)} TF stages" + ("" if not report.verified else
                                                  "; reloaded with TF + custom_ops: " +
                                                  ("equal to TF" if report.ok else "FAILED")))
    return 0 if report.ok else 1


def _run(action: str, rest: list[str], plan_path: Path, flavour: str) -> int:
    from bridge.migration.plan import load_plan
    from xgr_common.errors import MigrationError

    if action == "init":
        return _init(plan_path, flavour)
    plan = load_plan(plan_path)
    if action == "status":
        return _status(plan, plan_path)
    if action == "auto":
        return _auto(plan, plan_path, rest)
    if action == "assemble":
        return _assemble(plan, plan_path)
    if action == "export":
        return _export(plan_path)
    if len(rest) != 1:
        raise MigrationError(f"{action} takes exactly one STAGE, got {rest}")
    if action == "revert":
        return _revert(plan, plan_path, rest[0])
    if not FLAGS.module:
        raise MigrationError("swap needs --module pkg.mod:Class")
    return _swap(plan, plan_path, rest[0], FLAGS.module, FLAGS.kwargs)


def main(argv: list[str]) -> int:
    args = argv[1:]
    if not args or args[0] not in ACTIONS:
        print(f"usage: xgr migrate {{{'|'.join(ACTIONS)}}} [STAGE ...] --plan PLAN\n\n{__doc__}",
              file=sys.stderr)
        return 2
    action, rest = args[0], args[1:]
    plan_path = Path(FLAGS.plan)
    flavour = wanted_keras(action, plan_path)
    if "tensorflow" not in sys.modules:   # tf.keras is fixed when TF is imported: set it now
        if flavour == "tf_keras":
            os.environ[_LEGACY_ENV] = "1"
        else:
            os.environ.pop(_LEGACY_ENV, None)
    from bridge.migration.keras_flavours import process_flavour, rerun_in_child
    from xgr_common.errors import XgrError

    if process_flavour() != flavour:
        present = [FLAGS[name].serialize() for name in _FLAG_NAMES if FLAGS[name].present]
        return rerun_in_child("migrate", args, present, flavour)
    try:
        return _run(action, rest, plan_path, flavour)
    except XgrError as error:
        print(f"xgr migrate {action}: {error}", file=sys.stderr)
        return 1
