"""The way out: a fully migrated plan becomes one nn.Module, exported with torch.export, that
runs in a process without TensorFlow on batches of other sizes."""

from __future__ import annotations

import json
import subprocess
import sys

import ctr_keras3
import numpy as np
import pytest
import torch

from bridge.migration.assemble import assemble, export_assembled
from bridge.migration.auto import auto_migrate
from bridge.migration.plan import MigrationPlan, StagePlan
from bridge.migration.stages import StagedModel
from bridge.parity.data import save_npz
from tests.child_env import child_env
from xgr_common.errors import MigrationError

# Heavy (conversions, torch.export, child processes): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

TORCH_ONLY = """
import json, sys
import numpy as np, torch
program = torch.export.load(sys.argv[1])
batch = np.load(sys.argv[2])
inputs = [torch.from_numpy(batch[name]) for name in json.loads(sys.argv[3])]
out = program.module()(*inputs)
assert "tensorflow" not in sys.modules and "keras" not in sys.modules
print("OUT" + json.dumps(out.detach().numpy().tolist()))
"""


def test_cli_assembles_and_the_export_runs_without_tensorflow(tmp_path):
    from test_cli import xgr

    save_npz(tmp_path / "batches.npz", ctr_keras3.history_batches(2, lengths=(6, 4)))
    p = ["--plan", str(tmp_path / "plan.json")]
    init, too_early, auto, done = xgr(
        ["migrate", "init", "--model", "ctr_keras3:attention_history", *p],
        ["migrate", "assemble", "--out", str(tmp_path / "out"), "--data",
         str(tmp_path / "batches.npz"), *p],
        ["migrate", "auto", *p],
        ["migrate", "assemble", "--out", str(tmp_path / "out"), "--data",
         str(tmp_path / "batches.npz"), *p])
    assert [init[0], auto[0], done[0]] == [0, 0, 0], done
    assert too_early[0] == 1 and "still run in TF" in too_early[2]
    assert "assembled 8 stages" in done[1] and "max abs err against TF on 2 batches" in done[1]
    # Another batch size and history length than the example the export was traced with.
    batch = ctr_keras3.history_batches(1, rows=3, lengths=(11,), seed=5)[0]
    np.savez(tmp_path / "other.npz", **batch)
    names = ["history", "target", "user"]
    proc = subprocess.run([sys.executable, "-c", TORCH_ONLY, str(tmp_path / "out/model.pt2"),
                           str(tmp_path / "other.npz"), json.dumps(names)],
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.array(json.loads(proc.stdout[proc.stdout.rfind("OUT") + 3:]))
    expected = ctr_keras3.attention_history()([batch[n] for n in names]).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)
    weights = (tmp_path / "out/weights.safetensors")
    assert weights.stat().st_size > 4 * 1808


def test_assembly_refuses_stages_still_in_tf():
    with pytest.raises(MigrationError, match="stages \\['field_bias'.*still run in TF"):
        assemble(MigrationPlan("ctr_keras3:fm", (StagePlan(
            "field_embedding", "torch", module="bridge.migration.keras_twins:Embedding"),)), ".")


def test_a_twin_that_returns_no_mask_is_refused_at_assembly(tmp_path):
    model = ctr_keras3.attention_history()
    names = [n for n in StagedModel(model).names if n != "item_embedding"]
    plan, _ = auto_migrate(MigrationPlan("ctr_keras3:attention_history"), tmp_path, model, names)
    plan = plan.with_stage(StagePlan("item_embedding", "torch", module="torch.nn:Identity"))
    with pytest.raises(MigrationError, match="stage 'item_embedding': the TF layer gives its "
                                             "output a Keras mask; Identity does not return one"):
        assemble(plan, tmp_path, model)


@pytest.mark.parametrize("factory, ops, example, other, expected", [
    ("distinct_ids", {"Unique"}, torch.tensor([4, 1, 4, 9, 1]),
     torch.tensor([3, 3, 2, 7, 7, 7, 1]), [[3, 2, 7, 1]]),
    ("positive_values", {"NonZero"}, torch.tensor([1.0, -2.0, 3.0]),
     torch.tensor([-1.0, 0.5, 2.0, -3.0, 4.0]), [[0.5, 2.0, 4.0], [[1], [2], [4]]]),
])
def test_data_dependent_sizes_export_unbacked(tmp_path, factory, ops, example, other, expected):
    import sequence_ops_models as models
    from bridge.migration.assemble import data_dependent_stages

    model = getattr(models, factory)()
    plan, (result,) = auto_migrate(MigrationPlan(f"sequence_ops_models:{factory}"), tmp_path,
                                   model, StagedModel(model).names)
    assert result.ok, result.reasons
    assembled = assemble(plan, tmp_path, model)
    assert set(data_dependent_stages(assembled)[factory]) == ops
    got = export_assembled(assembled, [example]).module()(other)
    got = got if isinstance(got, tuple) else (got,)
    assert [g.tolist() for g in got] == expected
