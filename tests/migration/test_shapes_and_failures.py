"""Converted stages keep open dimensions dynamic or say which they fixed; every failure is
attributed to its stage, in exceptions and in the parity report."""

from __future__ import annotations

import json

import numpy as np
import pytest
import shape_models
import toy_models

from bridge.migration.auto import auto_migrate
from bridge.migration.convert import convert_stages, format_reasons
from bridge.migration.plan import MigrationPlan, StagePlan
from bridge.migration.runner import PlanRunner
from bridge.migration.stages import StageError
from bridge.parity.harness import RUN_FAILED
from bridge.parity.pytest_helper import check_parity
from bridge.parity.report import write_report
from xgr_common.errors import MigrationError

# Heavy (tf2onnx conversions): left out of `make test-quick`.
pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def decayed(tmp_path_factory):
    """decayed_history with every stage converted (conversion notes kept)."""
    plan_dir = tmp_path_factory.mktemp("decayed")
    model = shape_models.decayed_history()
    plan, results = auto_migrate(MigrationPlan("shape_models:decayed_history"), plan_dir, model,
                                 ["item_embedding", "position_decay", "weighted_sum"])
    return plan, plan_dir, {r.name: r for r in results}


def test_open_dimensions_stay_dynamic_and_fixed_ones_are_reported(decayed):
    _, _, results = decayed
    assert all(r.ok for r in results.values()), format_reasons(list(results.values()))
    assert [v.shape for v in results["item_embedding"].spec.inputs] == [(None, None)]
    assert results["item_embedding"].notes == ()
    (note, why) = results["position_decay"].notes
    assert "fixed dimensions (input 0 dim 1 = 3)" in note and "with dynamic sizes" in why
    assert [v.shape for v in results["position_decay"].spec.inputs] == [(None, 3)]


def test_batches_of_other_lengths_run_through_dynamic_stages(decayed):
    plan, plan_dir, _ = decayed
    dynamic_only = MigrationPlan(plan.model, (plan.stage("item_embedding"),
                                              plan.stage("weighted_sum")))
    result = check_parity(dynamic_only, shape_models.history_batches((6, 9, 2)),
                          plan_dir=plan_dir)
    assert result.passed, result.summary()
    assert result.input_shapes["item_embedding"] == ("5x6", "5x9", "5x2")


def test_a_length_outside_a_fixed_stage_is_an_error_naming_the_stage(decayed, tmp_path):
    plan, plan_dir, _ = decayed
    runner = PlanRunner(plan, plan_dir)
    runner.run(shape_models.history_batches((3,))[0])
    with pytest.raises(StageError, match="stage 'position_decay': the Torch module failed on "
                                         "inputs int32\\[5, 9\\].*dimension\\(s\\) \\[1\\] fixed "
                                         "to \\[3\\]"):
        runner.run(shape_models.history_batches((9,))[0])
    # Parity writes the failure as the stage's row instead of stopping.
    result = check_parity(plan, shape_models.history_batches((3, 9)), plan_dir=plan_dir)
    assert not result.passed and result.first_failure.stage == "position_decay"
    assert result.first_failure.output == RUN_FAILED
    assert "raised in the migrated run" in result.summary()
    markdown = write_report(result, tmp_path, "decayed").read_text()
    row = next(line for line in markdown.splitlines() if "first failure" in line)
    assert "| position_decay | (migrated run) |" in row and "| torch | 5x3; 5x9 |" in row


def test_every_stage_gets_its_own_reason_without_data():
    results = {r.name: r for r in convert_stages(shape_models.checked_ids())}
    assert results["dense"].ok
    sampled = " ".join(results["positive_ids"].reasons)
    assert "cannot sample the stage's inputs (random inputs; pass real ones with --data" in sampled
    assert "ids must be positive" in sampled
    traced = " ".join(results["traces_badly"].reasons)
    assert "tf2onnx failed" in traced and "the real cause: a Python-side check" in traced


def test_a_wrong_shaped_torch_stage_is_reported_at_itself():
    plan = MigrationPlan("toy_models:mlp", (StagePlan("middle", "torch",
                                                      module="torch.nn:Identity"),))
    result = check_parity(plan, toy_models.mlp_batches(1))
    assert result.first_failure.stage == "middle"
    assert "output 0 of the Torch stage is float32[5, 16]; the TF layer gives " \
           "float32[None, 8]" in result.first_failure.problem
    assert [r.stage for r in result.rows] == ["hidden", "norm", "middle"]


def test_a_module_that_cannot_be_built_names_its_stage():
    plan = MigrationPlan("toy_models:mlp", (StagePlan("middle", "torch", module="torch.nn:Linear"),))
    with pytest.raises(MigrationError, match="stage 'middle': torch.nn:Linear.Class\\(\\*\\*kwargs\\) "
                                             "failed for the Dense layer: TypeError"):
        PlanRunner(plan, ".")


@pytest.mark.parametrize("damage", ["graph.json", "tensors.safetensors", "nodes"])
def test_corrupt_converted_files_name_the_stage_and_the_file(decayed, tmp_path, damage):
    import shutil

    plan, plan_dir, _ = decayed
    folder = tmp_path / "converted" / "item_embedding"
    shutil.copytree(plan_dir / "converted" / "item_embedding", folder)
    if damage == "nodes":
        payload = json.loads((folder / "graph.json").read_text())
        del payload["nodes"][0]["op_type"]
        (folder / "graph.json").write_text(json.dumps(payload))
    else:
        (folder / damage).write_bytes(b"\x00garbage")
    with pytest.raises(MigrationError, match=f"stage 'item_embedding': .*{'graph.json' if damage == 'nodes' else damage}"):
        PlanRunner(MigrationPlan(plan.model, (plan.stage("item_embedding"),)), tmp_path)


def test_cli_bad_data_and_corrupt_stages_exit_1_with_the_reason(tmp_path):
    from bridge.parity.data import save_npz
    from test_cli import xgr

    save_npz(tmp_path / "bad.npz", [{"not_x": np.zeros((2, toy_models.FEATURES), np.float32)}])
    save_npz(tmp_path / "wrong_dtype.npz", [{"x": np.array([["a"] * toy_models.FEATURES])}])
    p = ["--plan", str(tmp_path / "plan.json")]
    init, bad, wrong, auto, swap = xgr(
        ["migrate", "init", "--model", "toy_models:mlp", *p],
        ["migrate", "auto", "--data", str(tmp_path / "bad.npz"), *p],
        ["migrate", "auto", "--data", str(tmp_path / "wrong_dtype.npz"), *p],
        ["migrate", "auto", "hidden", *p],
        ["migrate", "swap", "middle", "--module", "bridge.migration.keras_twins:Dense", *p])
    assert [init[0], auto[0]] == [0, 0], (init, auto)
    assert bad[0] == 1 and "missing ['x'], unexpected ['not_x']" in bad[2]
    assert wrong[0] == 1 and "Traceback" not in wrong[2] and wrong[2].strip(), wrong
    (tmp_path / "converted" / "hidden" / "graph.json").write_text("{not json")
    [(code, _, err)] = xgr(["migrate", "swap", "middle", "--module",
                            "bridge.migration.keras_twins:Dense", *p])
    assert code == 1 and "stage 'hidden'" in err and "graph.json is not valid JSON" in err
    assert "Traceback" not in err
