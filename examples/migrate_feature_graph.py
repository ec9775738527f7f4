"""Example (b): move the reference feature graph's dense stages from TF to Torch, one at a time,
with parity proven after every step.

    python examples/migrate_feature_graph.py --workdir /tmp/fg_migration

Steps (each followed by ``xgr parity``'s check on real batches of the synthetic world):

1. ``profile_tower`` (Dense, silu) -> the hand-written twin ``bridge.migration.keras_twins:Dense``
   (what ``xgr migrate swap profile_tower --module ...`` does);
2. ``profile_projection`` (Dense) -> converted automatically (``xgr migrate auto``);
3. every other stage is offered to the converter (``xgr migrate auto --dry_run``): the custom-op
   stages map to their Torch twins, the string and table stages stay in TF with their reasons;
4. the stages that convert (custom ops included) move too, and parity is checked once more.

The plan, the converted stages and one parity report per step land in ``--workdir``; the same
checks from the command line (the plan's factory lives in this file, hence the path)::

    PYTHONPATH=.:examples xgr migrate status --plan /tmp/fg_migration/plan.json
    PYTHONPATH=.:examples xgr parity --plan /tmp/fg_migration/plan.json \
        --data /tmp/fg_migration/batches.npz
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Defined only when run as a script: the plan imports this file again as the module of its
    model factory, and a second definition of the same flags would clash."""
    flags.DEFINE_string("workdir", None, "Folder for the plan, converted stages and reports "
                        "(default: a fresh temporary folder).")
    flags.DEFINE_integer("batches", 3, "Batches of users to compare at each step.")
    flags.DEFINE_integer("rows", 8, "Users per batch.")

DENSE_STAGES = ("profile_tower", "profile_projection")


def feature_graph():
    """The plan's model factory: the reference feature graph over a small synthetic world."""
    from tf_frontend.feature_graph import FeatureGraph
    from xgr_common.prompt_spec import PromptSpec
    from xgr_world.synthetic import WorldConfig, make_world

    world = make_world(WorldConfig(num_items=400, num_users=64))
    return FeatureGraph(PromptSpec(), world.item_ids, world.item_codes, seed=0)


@dataclass(frozen=True)
class Step:
    """One migration step: what moved, the Torch stages after it, and parity's verdict."""

    title: str
    torch_stages: tuple[str, ...]
    passed: bool
    summary: str
    report: Path


def write_batches(path: Path, batches: int, rows: int) -> None:
    from tf_frontend.feature_graph import features_from_world
    from bridge.parity.data import save_npz
    from xgr_world.synthetic import WorldConfig, make_world

    world = make_world(WorldConfig(num_items=400, num_users=64))
    save_npz(path, [features_from_world(world, slice(i * rows, (i + 1) * rows))
                    for i in range(batches)])


def run_example(workdir: Path, batches: int = 3, rows: int = 8) -> tuple[list[Step], str]:
    """Run every step; returns the steps and the conversion report of the remaining stages."""
    from bridge.migration.auto import auto_migrate
    from bridge.migration.convert import convert_stages, format_reasons
    from bridge.migration.plan import MigrationPlan, StagePlan, load_plan, save_plan
    from bridge.migration.stages import build_model
    from bridge.parity.data import load_batches
    from bridge.parity.pytest_helper import check_parity

    workdir.mkdir(parents=True, exist_ok=True)
    plan_path, data_path = workdir / "plan.json", workdir / "batches.npz"
    write_batches(data_path, batches, rows)
    factory = f"{Path(__file__).stem}:feature_graph"
    save_plan(MigrationPlan(factory), plan_path)                    # xgr migrate init
    model = build_model(factory)
    first_batch = load_batches(data_path, model)[0]
    steps: list[Step] = []

    def check(title: str) -> Step:
        report = workdir / f"report_{len(steps)}"
        result = check_parity(plan_path, data_path, report_dir=report)   # xgr parity
        step = Step(title, result.torch_stages, result.passed, result.summary(), report)
        steps.append(step)
        print(f"\n== step {len(steps) - 1}: {title}\n{step.summary}\nreport: {report}")
        return step

    check("all stages in TF (baseline)")
    # 1. xgr migrate swap profile_tower --module bridge.migration.keras_twins:Dense
    save_plan(load_plan(plan_path).with_stage(StagePlan(
        "profile_tower", "torch", module="bridge.migration.keras_twins:Dense")), plan_path)
    check("profile_tower -> hand-written Torch Dense twin")
    # 2. xgr migrate auto profile_projection --data batches.npz
    plan, results = auto_migrate(load_plan(plan_path), workdir, model, ["profile_projection"],
                                 first_batch)
    if not results[0].ok:
        raise SystemExit(format_reasons(results))
    save_plan(plan, plan_path)
    check("profile_projection -> converted automatically")
    # 3. xgr migrate auto --dry_run: what else could move, and why the rest stays in TF.
    remaining = [n for n in ("clean_history", "semantic_ids", "context_lookup", "hash_ids",
                             "sparse_embedding", "assemble_prompt")]
    outcomes = convert_stages(model, remaining, first_batch)
    lines = [f"{r.name}: converts ({', '.join(sorted({n.op_type for n in r.spec.nodes}))})"
             for r in outcomes if r.ok]
    report = "\n".join(lines + [format_reasons(outcomes)])
    print(f"\n== the other stages (xgr migrate auto --dry_run)\n{report}")
    # 4. move what converts (custom ops become their Torch twins) and check again.
    movable = [r.name for r in outcomes if r.ok]
    plan, _ = auto_migrate(load_plan(plan_path), workdir, model, movable, first_batch)
    save_plan(plan, plan_path)
    check(f"{', '.join(movable)} -> converted (custom ops as Torch twins)")
    return steps, report


def main(argv: list[str]) -> int:
    del argv
    workdir = Path(FLAGS.workdir or tempfile.mkdtemp(prefix="xgr_fg_migration_"))
    steps, _ = run_example(workdir, FLAGS.batches, FLAGS.rows)
    width = max(len(s.title) for s in steps)
    print("\nstep  " + "what moved".ljust(width) + "  parity")
    for i, step in enumerate(steps):
        print(f"{i:>4}  {step.title.ljust(width)}  {'PASS' if step.passed else 'FAIL'}")
    return 0 if all(s.passed for s in steps) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repository root
    _define_flags()
    app.run(main)
