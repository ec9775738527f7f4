"""Keras 3 and tf_keras (Keras 2) models side by side: plans record their Keras, each model is
built in the process its Keras needs, and both migrate stage by stage to full Torch."""

from __future__ import annotations

import json
import subprocess
import sys

import ctr_keras3
import pytest
import stepwise
from test_cli import ENV, ROOT, xgr

from bridge.migration.keras_flavours import check_process, env_flavour, flavour_of
from bridge.migration.plan import MigrationPlan, StagePlan, load_plan
from bridge.migration.runner import PlanRunner
from bridge.migration.stages import StagedModel, build_model
from bridge.parity.data import save_npz
from xgr_common.errors import MigrationError


def not_a_model():
    return object()


def subclassed_without_stages():
    import keras

    class Plain(keras.Model):
        def call(self, x):
            return x
    return Plain()


def test_plan_records_its_keras(tmp_path):
    plan = MigrationPlan("ctr_tf_keras:fm", keras="tf_keras")
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_json()))
    assert load_plan(tmp_path / "plan.json").keras == "tf_keras"
    assert MigrationPlan.from_json({"model": "a:b"}).keras == "keras3"
    with pytest.raises(MigrationError, match="keras must be one of"):
        MigrationPlan("a:b", keras="keras2")


@pytest.mark.parametrize("factory, message", [
    ("test_keras_flavours:not_a_model", "returned a builtins.object, not a Keras model"),
    ("test_keras_flavours:subclassed_without_stages",
     "subclassed keras3 model \\(Plain\\) without stages"),
])
def test_factories_without_stages_are_refused_with_the_reason(factory, message):
    with pytest.raises(MigrationError, match=message):
        build_model(factory)


def test_a_tf_keras_plan_is_refused_in_a_keras3_process():
    assert env_flavour({"TF_USE_LEGACY_KERAS": "1"}) == "tf_keras" and env_flavour({}) == "keras3"
    with pytest.raises(MigrationError, match="run it in a process started with "
                                             "TF_USE_LEGACY_KERAS=1"):
        PlanRunner(MigrationPlan("ctr_tf_keras:fm", keras="tf_keras"), ".")
    check_process("keras3", "this suite")   # the pytest process runs Keras 3


def test_shared_layer_calls_are_named_in_the_order_the_model_code_calls_them():
    staged = StagedModel(ctr_keras3.attention_history())
    assert flavour_of(staged.model) == "keras3"
    # items(history) is the first call in the code, items(target) the second (#1), although
    # Keras runs the target call first.
    assert staged.sources("item_embedding") == ["history"]
    assert staged.sources("item_embedding#1") == ["target"]
    assert staged.names.index("item_embedding#1") < staged.names.index("item_embedding")


def test_the_report_says_what_each_stage_reads_and_where_it_runs(tmp_path):
    from bridge.parity.pytest_helper import check_parity
    from bridge.parity.report import write_report

    plan = MigrationPlan("ctr_keras3:attention_history", (StagePlan(
        "item_embedding#1", "torch", module="bridge.migration.keras_twins:Embedding"),))
    result = check_parity(plan, ctr_keras3.history_batches(2, lengths=(6, 9)))
    assert result.passed, result.summary()
    lines = write_report(result, tmp_path, "history").read_text().splitlines()
    target = next(line for line in lines if line.startswith("|  | item_embedding#1 | output |"))
    assert target.endswith("| torch | 5x1 | target |")
    history = next(line for line in lines if line.startswith("|  | item_embedding | output |"))
    assert history.endswith("| tf | 5x6; 5x9 | history |")


STAGES = {
    "fm": ["field_embedding", "field_bias", "first_order", "fm_interaction", "dense_linear",
           "logit", "ctr"],
    # Keras 3 computes the target's mask for target_vector as an op node (not_equal).
    "attention_history": ["item_embedding#1", "item_embedding", "attention_pooling",
                          "target_vector", "features", "mlp", "ctr"],
    "multi_tower": ["id_embedding", "id_embedding#1", "item_pool", "item_tower", "score",
                    "user_pool", "user_tower"],
}


@pytest.mark.heavy
@pytest.mark.parametrize("keras", ["keras3", "tf_keras"])
@pytest.mark.parametrize("factory", ["fm", "attention_history", "multi_tower"])
def test_model_migrates_stage_by_stage_to_full_torch(tmp_path, keras, factory):
    """Each stage in turn is converted and the plan compared with TF; the history batches are
    padded to different lengths and carry Keras masks from Embedding(mask_zero=True). The
    tf_keras multi-tower model is subclassed: its stages convert on real batches."""
    import ctr_tf_keras_batches

    batches = {"fm": lambda: ctr_keras3.fm_batches(2),
               "attention_history": lambda: ctr_keras3.history_batches(3, lengths=(6, 9, 4)),
               "multi_tower": lambda: ctr_tf_keras_batches.multi_tower_batches(2)}[factory]()
    save_npz(tmp_path / "batches.npz", batches)
    module = "ctr_keras3" if keras == "keras3" else "ctr_tf_keras"
    steps = stepwise.run_child(keras, factory=f"{module}:{factory}",
                               data=str(tmp_path / "batches.npz"), dir=str(tmp_path),
                               real_samples=factory == "multi_tower")
    expected = list(STAGES[factory])
    if keras == "keras3" and factory == "attention_history":
        expected.insert(1, "not_equal")
    if factory == "multi_tower":   # the tf_keras one is subclassed: its stages are its layers
        names = set(expected) - ({"id_embedding#1"} if keras == "tf_keras" else set())
        assert sorted(s["stage"] for s in steps) == sorted(names)
    else:
        assert [s["stage"] for s in steps] == expected
    for step in steps:
        assert step["reasons"] == [] and step["notes"] == [] and step["passed"], step
    assert len(steps[-1]["torch"]) == len(steps)


@pytest.mark.heavy
def test_cli_runs_a_tf_keras_plan_in_its_own_process(tmp_path):
    """The caller runs Keras 3; init/auto/status/revert/parity of a tf_keras plan (a subclassed
    tf.keras.Model with stages) work because the CLI runs them where tf.keras is tf_keras."""
    import ctr_tf_keras_batches

    data = tmp_path / "batches.npz"
    save_npz(data, ctr_tf_keras_batches.multi_tower_batches(2))
    plan = tmp_path / "new_folder" / "plan.json"
    p = ["--plan", str(plan)]
    bad, init, auto, status, revert_unknown, revert = xgr(
        ["migrate", "init", "--model", "ctr_tf_keras:no_such_factory", "--keras", "tf_keras", *p],
        ["migrate", "init", "--model", "ctr_tf_keras:multi_tower", "--keras", "tf_keras", *p],
        ["migrate", "auto", "--data", str(data), *p],
        ["migrate", "status", *p],
        ["migrate", "revert", "no_such_stage", *p],
        ["migrate", "revert", "score", *p])
    assert bad[0] == 1 and "has no 'no_such_factory'" in bad[2]
    assert init[0] == 0, init
    assert "(model ctr_tf_keras:multi_tower, tf_keras): 0 of 6 stages in Torch" in init[1]
    assert auto[0] == 0, auto
    assert "6 of 6 stages in Torch" in status[1]
    assert revert_unknown[0] == 1 and "no stage 'no_such_stage'" in revert_unknown[2]
    assert revert[0] == 0 and "score: runs in TF again" in revert[1]
    stored = json.loads(plan.read_text())
    assert stored["keras"] == "tf_keras" and "score" not in stored["stages"]
    proc = subprocess.run([sys.executable, "-m", "xgr_cli.main", "parity", *p, "--data",
                           str(data)], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "parity PASSED" in proc.stdout


@pytest.mark.heavy
def test_init_checks_the_model_before_writing(tmp_path):
    plan = tmp_path / "plan.json"
    [(code, _, err)] = xgr(["migrate", "init", "--model", "test_keras_flavours:not_a_model",
                            "--plan", str(plan)])
    assert code == 1 and "not a Keras model" in err
    assert not plan.exists()
