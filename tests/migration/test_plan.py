"""Plan files: round trip, and each validation rule raising a MigrationError that names it."""

from __future__ import annotations

import json

import pytest

from bridge.migration.plan import MigrationPlan, StagePlan, load_plan, save_plan
from xgr_common.errors import MigrationError


def test_save_then_load_round_trips(tmp_path):
    plan = MigrationPlan("toy_models:mlp", (
        StagePlan("hidden", "torch", module="bridge.migration.keras_twins:Dense"),
        StagePlan("head", "torch", converted="converted/head"),
        StagePlan("extra", "torch", module="pkg.mod:Cls", kwargs={"width": 3})))
    save_plan(plan, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json") == plan
    assert json.loads((tmp_path / "plan.json").read_text())["stages"]["head"] == {
        "runtime": "torch", "converted": "converted/head"}


def test_with_stage_replaces_and_tf_entries_drop_out():
    plan = MigrationPlan("a.b:c", (StagePlan("s", "torch", module="m.n:K"),))
    moved = plan.with_stage(StagePlan("t", "torch", converted="converted/t"))
    assert [s.name for s in moved.torch_stages()] == ["s", "t"]
    assert moved.with_stage(StagePlan("s")).stage("s").runtime == "tf"
    assert moved.with_stage(StagePlan("s")).stages == (moved.stage("t"),)
    assert plan.stage("unlisted") == StagePlan("unlisted")


@pytest.mark.parametrize("payload, message", [
    ({"stages": {}}, "missing 'model'"),
    ({"model": "no_colon"}, "package.module:Name"),
    ({"model": "a:b", "extra": 1}, "unknown keys"),
    ({"model": "a:b", "version": 9}, "version 9"),
    ({"model": "a:b", "stages": []}, "must map stage names"),
    ({"model": "a:b", "stages": {"s": {"runtime": "jax"}}}, "runtime must be one of"),
    ({"model": "a:b", "stages": {"s": {"runtime": "torch"}}}, "exactly one of"),
    ({"model": "a:b", "stages": {"s": {"runtime": "torch", "module": "a:B",
                                       "converted": "c"}}}, "exactly one of"),
    ({"model": "a:b", "stages": {"s": {"runtime": "torch", "converted": "/abs"}}}, "inside the plan"),
    ({"model": "a:b", "stages": {"s": {"runtime": "torch", "converted": "../up"}}}, "inside the plan"),
    ({"model": "a:b", "stages": {"s": {"runtime": "tf", "module": "a:B"}}}, "takes no module"),
    ({"model": "a:b", "stages": {"s": {"runtime": "torch", "module": "bad spec"}}}, "module must be"),
    ({"model": "a:b", "stages": {"s": {"runtime": "torch", "modul": "a:B"}}}, "unknown keys"),
])
def test_invalid_plans_are_rejected_with_the_rule(tmp_path, payload, message):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(MigrationError, match=message):
        load_plan(path)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(MigrationError, match="does not exist"):
        load_plan(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(MigrationError, match="not valid JSON"):
        load_plan(tmp_path / "bad.json")


def test_duplicate_stages_and_unknown_stage_names():
    with pytest.raises(MigrationError, match="more than once"):
        MigrationPlan("a:b", (StagePlan("s"), StagePlan("s")))
    plan = MigrationPlan("a:b", (StagePlan("typo", "torch", module="a:B"),))
    with pytest.raises(MigrationError, match="stages the model lacks: \\['typo'\\]"):
        plan.check_stages_exist(["hidden", "head"])
