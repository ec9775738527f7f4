"""The runner: the all-TF walk is the model; swapped stages run in Torch through DLPack."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import toy_models

from bridge.migration.stages import StagedModel
from bridge.migration.plan import MigrationPlan, StagePlan
from bridge.migration.runner import PlanRunner
from bridge.parity.harness import run_parity
from bridge.parity.pytest_helper import assert_parity
from bridge.parity.pytest_plugin import parity  # noqa: F401  (the fixture, as users enable it)
from xgr_common.errors import MigrationError, ParityError

TWINS = "bridge.migration.keras_twins"


def test_all_tf_walk_reproduces_the_model():
    model = toy_models.mlp()
    batch = toy_models.mlp_batches(1)[0]
    staged = StagedModel(model)
    outputs, boundaries = staged.run(batch)
    assert outputs[0][0] == "head"
    np.testing.assert_array_equal(outputs[0][1].numpy(), model(batch["x"]).numpy())
    assert list(boundaries) == ["hidden", "norm", "middle", "head"] == staged.names


def test_swapped_stages_run_in_torch_and_keep_parity():
    plan = MigrationPlan("toy_models:mlp", (StagePlan("hidden", "torch", module=f"{TWINS}:Dense"),
                                            StagePlan("norm", "torch",
                                                      module=f"{TWINS}:LayerNormalization")))
    runner = PlanRunner(plan, ".")
    calls = []
    hidden = runner.modules["hidden"]
    hidden.register_forward_hook(lambda m, i, o: calls.append(type(i[0]).__module__))
    result = run_parity(runner, toy_models.mlp_batches(2), progress=False)
    assert calls == ["torch", "torch", ], "the Torch twin ran once per batch on torch tensors"
    assert result.passed, result.summary()
    assert [r.stage for r in result.rows] == ["hidden", "norm", "middle", "head", "(model output)"]
    # Swapped stages really differ in bits from TF somewhere (not a TF stage in disguise).
    assert result.rows[0].max_abs > 0 or result.rows[1].max_abs > 0


def test_embedding_twin_takes_integer_ids():
    plan = MigrationPlan("toy_models:embedding_dense",
                         (StagePlan("embed", "torch", module=f"{TWINS}:Embedding"),))
    rng = np.random.default_rng(0)
    batches = [{"ids": rng.integers(0, toy_models.VOCAB, (3, 4)).astype(np.int32)}]
    assert_parity(plan, batches)


def test_broken_module_fails_parity_at_its_stage():
    plan = MigrationPlan("toy_models:mlp", (StagePlan("middle", "torch",
                                                      module="toy_models:BrokenDense"),))
    with pytest.raises(ParityError, match="first failing stage 'middle', output 'output', "
                                          "dtype float32, shape \\[5, 8\\]: max abs err"):
        assert_parity(plan, toy_models.mlp_batches(1))


def test_twin_refuses_the_wrong_layer_type():
    plan = MigrationPlan("toy_models:with_unconvertible",
                         (StagePlan("country_lookup", "torch", module=f"{TWINS}:Dense"),))
    with pytest.raises(MigrationError, match="Dense twin needs a keras Dense layer"):
        PlanRunner(plan, ".")


def test_string_inputs_cannot_cross_into_a_torch_stage():
    plan = MigrationPlan("toy_models:with_unconvertible",
                         (StagePlan("country_lookup", "torch", module="torch.nn:Identity"),))
    runner = PlanRunner(plan, ".")
    batch = {"country": np.array([[b"us"]]), "user": np.array([[7]]),
             "x": np.zeros((1, toy_models.FEATURES), np.float32)}
    with pytest.raises(MigrationError, match="stage 'country_lookup': input 0 cannot cross"):
        runner.run(batch)


def test_module_that_is_not_a_torch_module_is_refused():
    plan = MigrationPlan("toy_models:mlp", (StagePlan("hidden", "torch",
                                                      module="toy_models:mlp_batches"),))
    with pytest.raises(MigrationError, match="expected a torch.nn.Module"):
        PlanRunner(plan, ".")


def test_unknown_factory_and_stage_are_named():
    with pytest.raises(MigrationError, match="cannot import 'no_such_module'"):
        PlanRunner(MigrationPlan("no_such_module:f"), ".")
    with pytest.raises(MigrationError, match="stages the model lacks: \\['hiden'\\]"):
        PlanRunner(MigrationPlan("toy_models:mlp", (StagePlan("hiden", "torch", module="a:B"),)), ".")


def test_batch_must_name_the_model_inputs():
    runner = PlanRunner(MigrationPlan("toy_models:mlp"), ".")
    with pytest.raises(Exception, match="missing \\['x'\\], unexpected \\['y'\\]"):
        runner.run({"y": tf.zeros((2, toy_models.FEATURES))})


def test_parity_fixture_writes_its_report_and_fails_with_its_path(parity, tmp_path):
    good = MigrationPlan("toy_models:mlp", (StagePlan("head", "torch", module=f"{TWINS}:Dense"),))
    assert parity(good, toy_models.mlp_batches(1)).passed
    assert (tmp_path / "parity_report" / "parity_report.html").is_file()
    broken = MigrationPlan("toy_models:mlp", (StagePlan("head", "torch",
                                                        module="toy_models:BrokenDense"),))
    with pytest.raises(ParityError, match=f"first failing stage 'head'(.|\n)*report: {tmp_path}"):
        parity(broken, toy_models.mlp_batches(1))
