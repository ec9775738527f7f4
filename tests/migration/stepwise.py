"""Migrate a model one stage at a time with ``xgr migrate auto``'s engine, checking parity
after every step; runnable in a child process for models that need tf_keras:

    TF_USE_LEGACY_KERAS=1 python stepwise.py \
        '{"factory": ..., "keras": ..., "data": ..., "dir": ..., "real_samples": false}'

prints ``RESULT`` followed by the steps as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def migrate_stage_by_stage(factory: str, keras: str, data: str, plan_dir: str,
                           real_samples: bool = False) -> list[dict]:
    """One step per stage, in execution order: convert it (on random inputs, or on the first
    batch of ``data`` with ``real_samples``), then compare the plan with TF on ``data``.
    Returns each step's stage, conversion reasons and notes, and parity summary."""
    from bridge.migration.auto import auto_migrate
    from bridge.migration.plan import MigrationPlan, save_plan
    from bridge.migration.stages import StagedModel, build_model
    from bridge.parity.data import load_batches
    from bridge.parity.pytest_helper import check_parity

    model = build_model(factory, keras)
    plan = MigrationPlan(factory, keras=keras)
    batches = load_batches(data, model)
    steps = []
    for name in StagedModel(model).names:
        plan, (result,) = auto_migrate(plan, plan_dir, model, [name],
                                       batches[0] if real_samples else None)
        save_plan(plan, Path(plan_dir) / "plan.json")
        parity = check_parity(plan, batches, plan_dir=plan_dir)
        steps.append({"stage": name, "reasons": list(result.reasons), "notes": list(result.notes),
                      "passed": parity.passed, "summary": parity.summary(),
                      "torch": [s.name for s in plan.torch_stages()]})
    return steps


def run_child(keras: str, **request) -> list[dict]:
    """:func:`migrate_stage_by_stage` in a fresh process whose ``tf.keras`` is ``keras``."""
    from tests.child_env import child_env

    env = child_env(HERE, **({"TF_USE_LEGACY_KERAS": "1"} if keras == "tf_keras" else {}))
    if keras != "tf_keras":
        env.pop("TF_USE_LEGACY_KERAS", None)
    proc = subprocess.run([sys.executable, str(Path(__file__)), json.dumps({"keras": keras,
                                                                             **request})],
                          env=env, capture_output=True, text=True, timeout=600)
    marker = proc.stdout.rfind("RESULT")
    if marker < 0:
        raise AssertionError(proc.stderr[-4000:])
    return json.loads(proc.stdout[marker + len("RESULT"):])


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    print("RESULT" + json.dumps(migrate_stage_by_stage(args["factory"], args["keras"],
                                                       args["data"], args["dir"],
                                                       args.get("real_samples", False))))
