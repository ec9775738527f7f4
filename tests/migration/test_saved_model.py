"""SavedModels and tf.Modules migrate through FunctionStage: one stage per function or
signature, several inputs each, to full Torch with parity at every step."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import ranker_module
import tensorflow as tf

from bridge.migration.saved_model import FunctionStage, signature_model
from bridge.migration.stages import StagedModel
from bridge.parity.data import save_npz
from xgr_common.errors import MigrationError

# Heavy (tf2onnx conversions, SavedModels, CLI processes): left out of `make test-quick`.
pytestmark = pytest.mark.heavy


def test_tf_module_ranker_migrates_stage_by_stage(tmp_path):
    import stepwise

    save_npz(tmp_path / "batches.npz", ranker_module.ranker_batches(2))
    steps = stepwise.migrate_stage_by_stage("ranker_module:module_ranker", "keras3",
                                            str(tmp_path / "batches.npz"), str(tmp_path),
                                            real_samples=True)   # row_splits must be valid
    assert [s["stage"] for s in steps] == ["pool", "score"]
    for step in steps:
        assert step["reasons"] == [] and step["passed"], step
    assert steps[-1]["torch"] == ["pool", "score"]


def test_function_stage_names_inputs_and_outputs():
    module = ranker_module.RankerModule()
    stage = FunctionStage(module.score, name="score")
    assert stage.input_names == ["pooled", "dense"]
    assert stage.output_names == ["logit", "probability"]
    with pytest.raises(MigrationError, match="must name each of the function's inputs"):
        FunctionStage(module.score, input_names=["pooled"], name="bad")
    with pytest.raises(MigrationError, match="needs a tf.function with an input_signature"):
        FunctionStage(tf.function(lambda x: x), name="untraced")


def test_saved_model_signature_with_several_inputs_through_the_cli(tmp_path):
    """A SavedModel whose serving signature takes two inputs (which TFSMLayer cannot call):
    init, auto and parity as a user runs them, with a factory file of their own."""
    from test_cli import ROOT, xgr
    from tests.child_env import child_env

    module = ranker_module.RankerModule()
    tf.saved_model.save(module, str(tmp_path / "saved"), signatures={"serving_default":
                                                                      module.score})
    (tmp_path / "team_factory.py").write_text(textwrap.dedent(f"""
        from bridge.migration.saved_model import signature_model

        def build():
            return signature_model({str(tmp_path / 'saved')!r})
    """))
    model = signature_model(tmp_path / "saved")
    assert StagedModel(model).names == ["serving_default"]
    batch = ranker_module.ranker_batches(1)[0]
    pooled = module.pool(batch["item_ids"], batch["row_splits"])
    save_npz(tmp_path / "batches.npz", [{"pooled": pooled, "dense": batch["dense"]}])
    p = ["--plan", str(tmp_path / "migration" / "plan.json")]
    init, auto = xgr(["migrate", "init", "--model", "team_factory:build", *p],
                     ["migrate", "auto", *p], env=child_env(tmp_path))
    assert init[0] == 0 and auto[0] == 0, (init, auto)
    assert "serving_default: converted, now runs in Torch" in auto[1]
    proc = subprocess.run([sys.executable, "-m", "xgr_cli.main", "parity", *p, "--data",
                           str(tmp_path / "batches.npz")], cwd=ROOT,
                          env=child_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "parity PASSED" in proc.stdout
    assert json.loads((tmp_path / "migration/plan.json").read_text())["stages"] == {
        "serving_default": {"runtime": "torch", "converted": "converted/serving_default"}}
