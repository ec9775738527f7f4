"""Every step of a migration deployed: the plan exported as one SavedModel with its Torch stages
inside (TorchCall on each stage's AOTInductor package), reloaded in a fresh process without
Python torch, rolled out version by version to the server `xgr serve` runs, queried with
tensorflow-serving-api's gRPC stub and equal to the TF model within the tolerance table.

The suite's models: an FM, attention over a masked history (masks cross into and out of
Torch), and a tf.Module ranker taking a ragged history as values + row splits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import ctr_keras3
import grpc
import numpy as np
import pytest
import ranker_module
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from bridge.migration.auto import auto_migrate
from bridge.migration.functional import output_names
from bridge.migration.plan import MigrationPlan, StagePlan, save_plan
from bridge.migration.stages import build_model
from bridge.parity.compare import compare
from bridge.parity.data import load_batches, save_npz
from bridge.parity.saved_model import saved_model_parity
from tests.child_env import child_env
from tests.serving.helpers import http, start_server
from xgr_common.errors import ExportError
from xgr_export.migrated_model import MigratedExportConfig, export_migrated

# Heavy (AOTInductor packages, SavedModels, fresh processes, servers).
pytestmark = pytest.mark.heavy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
POOL_TWIN = "ranker_twins:RaggedMeanPool"


@dataclass(frozen=True)
class Migration:
    """One model of the suite: its factory, its batches, the stages each step moves (a stage
    given as ``name=pkg.mod:Class`` is swapped to that hand-written module, the others are
    converted), its ragged inputs, and requests to serve that the export never saw."""

    factory: str
    batches: list
    steps: tuple[tuple[str, ...], ...]
    ragged: dict
    requests: list


MIGRATIONS = {
    "fm": Migration("ctr_keras3:fm", ctr_keras3.fm_batches(2),
                    (("fm_interaction",), ("field_embedding", "dense_linear")), {},
                    ctr_keras3.fm_batches(2, rows=1, seed=7) + ctr_keras3.fm_batches(1, 3, 8)),
    "attention": Migration("ctr_keras3:attention_history",
                           ctr_keras3.history_batches(2, lengths=(6, 4)),
                           (("attention_pooling",), ("item_embedding", "item_embedding#1")), {},
                           ctr_keras3.history_batches(1, rows=1, seed=7, lengths=(3,))
                           + ctr_keras3.history_batches(1, rows=3, seed=8, lengths=(9,))),
    "ranker": Migration("ranker_module:module_ranker", ranker_module.ranker_batches(2),
                        ((f"pool={POOL_TWIN}",), ("score",)), {"row_splits": ("item_ids",)},
                        ranker_module.ranker_batches(1, rows=1, seed=7)
                        + ranker_module.ranker_batches(1, rows=5, seed=8)),
}


@dataclass(frozen=True)
class Step:
    saved_model: Path
    report: object
    torch_stages: tuple[str, ...]
    seconds: float


def _move(plan: MigrationPlan, plan_dir: Path, model, stages, batch) -> MigrationPlan:
    converted = []
    for stage in stages:
        name, _, module = stage.partition("=")
        if module:
            plan = plan.with_stage(StagePlan(name, "torch", module=module))
        else:
            converted.append(name)
    if converted:
        plan, results = auto_migrate(plan, plan_dir, model, converted, batch)
        assert all(r.ok for r in results), [(r.name, r.reasons) for r in results]
    return plan


@pytest.fixture(scope="module")
def package_cache(tmp_path_factory) -> Path:
    """Compiled stage packages, shared by every export of the module (CLI runs included)."""
    return tmp_path_factory.mktemp("stage_packages")


@pytest.fixture(scope="module")
def migrated(tmp_path_factory, package_cache):
    """model key -> its steps, each exported once (stage packages shared by a cache)."""
    cache = package_cache
    built: dict[str, list[Step]] = {}

    def steps(key: str) -> list[Step]:
        if key in built:
            return built[key]
        migration, root = MIGRATIONS[key], tmp_path_factory.mktemp(key)
        save_npz(root / "batches.npz", migration.batches)
        model = build_model(migration.factory)
        batch = load_batches(root / "batches.npz", model)[0]
        plan, found = MigrationPlan(migration.factory), []
        for number, stages in enumerate(migration.steps, start=1):
            plan = _move(plan, root, model, stages, batch)
            save_plan(plan, root / "plan.json")
            started = time.perf_counter()
            report = export_migrated(MigratedExportConfig(
                plan=root / "plan.json", out=root / f"step_{number}", data=root / "batches.npz",
                ragged=migration.ragged, cache_dir=cache))
            found.append(Step(report.saved_model, report,
                              tuple(s.name for s in plan.torch_stages()),
                              time.perf_counter() - started))
        built[key] = found
        return found
    return steps


def _tf_outputs(model, request: dict) -> dict[str, np.ndarray]:
    values = model([request[x.name] for x in model.inputs])
    values = values if isinstance(values, (list, tuple)) else [values]
    return {name: v.numpy() for name, v in zip(output_names(model), values)}


def _predict(port: int, request: dict, version: int) -> dict[str, np.ndarray]:
    proto = predict_pb2.PredictRequest()
    proto.model_spec.name = "recs"
    proto.model_spec.version.value = version
    for name, array in request.items():
        proto.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            proto, timeout=60)
    return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


def _states(port: int) -> dict[int, str]:
    _, body = http(port, "/v1/models/recs")
    return {int(v["version"]): v["state"] for v in body["model_version_status"]}


def _wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


@pytest.mark.parametrize("key", sorted(MIGRATIONS))
def test_each_step_reloads_without_torch_and_serves_equal_to_tf(migrated, key, tmp_path):
    steps, migration = migrated(key), MIGRATIONS[key]
    model = build_model(migration.factory)
    for step in steps:
        # Reloaded in a fresh process with TF + custom_ops only, equal to TF on the batch.
        assert step.report.ok, step.report.to_json()
        assert not step.report.forbidden_modules and step.report.verified
        assert set(s.name for s in step.report.torch_stages) == set(step.torch_stages)
        # Every stage boundary and output on every batch, in the parity report's rows.
        parity = saved_model_parity(step.saved_model, load_batches(
            step.saved_model.parent / "batches.npz", model), model)
        assert parity.passed, parity.summary()
        assert set(parity.torch_stages) == set(step.torch_stages)
    # Rolled out one step after the other, as a team deploys them.
    base = tmp_path / "recs"
    shutil.copytree(steps[0].saved_model, base / "1")
    server = start_server(str(base), file_system_poll_wait_seconds=0.2)
    try:
        for version, step in enumerate(steps, start=1):
            if version > 1:
                shutil.copytree(step.saved_model, tmp_path / "staging")
                os.rename(tmp_path / "staging", base / str(version))
                _wait_for(lambda: _states(server.rest_port).get(version) == "AVAILABLE")
            for request in migration.requests:
                got = _predict(server.grpc_port, request, version)
                for name, expected in _tf_outputs(model, request).items():
                    row = compare("(model output)", name, got[name], expected)
                    assert row.passed, (key, version, name, row.problem)
        if key == "attention":   # a history id past the table, which runs in Torch now
            request = dict(migration.requests[1], history=migration.requests[1]["history"] + 40)
            with pytest.raises(grpc.RpcError) as refused:
                _predict(server.grpc_port, request, len(steps))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "stage item_embedding: input 0 (history) holds ids, which must lie in " \
                   "[0, 40)" in refused.value.details()
    finally:
        server.stop()


def test_bad_input_is_refused_naming_the_stage_and_the_input(migrated):
    # Step 2 of the attention model: both item embeddings in Torch, the history's ids
    # checked before the compiled code reads the table with them.
    attention = tf.saved_model.load(str(migrated("attention")[1].saved_model)).signatures[
        "serving_default"]
    request = ctr_keras3.history_batches(1, rows=2)[0]
    history = request["history"].copy()
    history[1, 0] = ctr_keras3.ITEMS + 3
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"stage item_embedding: input 0 \(history\) holds ids, which "
                             r"must lie in \[0, 40\)"):
        attention(history=tf.constant(history), target=tf.constant(request["target"]),
                  user=tf.constant(request["user"]))
    fm = tf.saved_model.load(str(migrated("fm")[1].saved_model)).signatures["serving_default"]
    request = ctr_keras3.fm_batches(1, rows=2)[0]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"stage dense_linear: input dense must have size 3 in dimension "
                             r"1 \(the model declares shape \(None, 3\)\)"):
        fm(fields=tf.constant(request["fields"]), dense=tf.zeros([2, 4]))
    # A rank the model does not declare: the signature takes it, the walk refuses it before
    # any stage (TF's or Torch's) reads it.
    good = ctr_keras3.history_batches(1, rows=2)[0]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"stage item_embedding: input history must have rank 2"):
        attention(history=tf.constant(good["history"][:, 0]),
                  target=tf.constant(good["target"]), user=tf.constant(good["user"]))

    ranker = tf.saved_model.load(str(migrated("ranker")[1].saved_model)).signatures[
        "serving_default"]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"stage pool: input row_splits \(the row splits of "
                             r"item_ids\) must never decrease"):
        ranker(item_ids=tf.constant([1, 2, 3], tf.int64),
               row_splits=tf.constant([0, 2, 1, 3], tf.int64), dense=tf.zeros([3, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"stage score: input 1 \(dense\) dimension 0 must equal "
                             r"input 0 \(pool\) dimension 0"):
        ranker(item_ids=tf.constant([1, 2, 3], tf.int64),
               row_splits=tf.constant([0, 2, 3], tf.int64), dense=tf.zeros([4, 3]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"stage pool: input row_splits must have rank 1"):
        ranker(item_ids=tf.constant([1, 2, 3], tf.int64),
               row_splits=tf.constant([[0, 2, 3]], tf.int64), dense=tf.zeros([2, 3]))


def test_export_to_a_relative_folder(migrated, package_cache, tmp_path, monkeypatch):
    """`--out export/step_2` as the guide writes it: the check reloads the SavedModel in a
    process started in another folder, so the export must not hand it a relative path."""
    root = migrated("attention")[-1].saved_model.parent   # the last step's plan and data
    monkeypatch.chdir(tmp_path)
    report = export_migrated(MigratedExportConfig(
        plan=root / "plan.json", out=Path("export") / "step_2", data=root / "batches.npz",
        cache_dir=package_cache))
    assert report.ok, report.to_json()
    assert report.saved_model == (tmp_path / "export" / "step_2").resolve()


def test_a_python_only_stage_is_refused_with_its_name_and_the_reason(tmp_path):
    save_npz(tmp_path / "batches.npz", ctr_keras3.fm_batches(1))
    save_plan(MigrationPlan("ctr_keras3:fm").with_stage(
        StagePlan("fm_interaction", "torch", module="python_only:NumpyInteraction")),
        tmp_path / "plan.json")
    with pytest.raises(ExportError, match=r"stage 'fm_interaction' cannot be exported with "
                                          r"torch.export \(NumpyInteraction\): "):
        export_migrated(MigratedExportConfig(plan=tmp_path / "plan.json", out=tmp_path / "out",
                                             data=tmp_path / "batches.npz"))
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_cli_exports_a_step_and_parity_reads_the_saved_model(migrated, package_cache,
                                                              tmp_path):
    """`xgr migrate export` and `xgr parity --saved_model` as a team runs them, on the
    ranker's first step (its package comes from the shared cache)."""
    root = migrated("ranker")[0].saved_model.parent
    save_plan(MigrationPlan("ranker_module:module_ranker").with_stage(
        StagePlan("pool", "torch", module=POOL_TWIN)), tmp_path / "plan.json")
    env = child_env(HERE, TF_CPP_MIN_LOG_LEVEL="3")

    def xgr(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "xgr_cli.main", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)

    common = ["--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "sm"), "--data",
              str(root / "batches.npz"), "--ragged", '{"row_splits": ["item_ids"]}',
              "--cache_dir", str(package_cache)]
    bad = xgr("migrate", "export", *common, "--devices", '{"pool": "gpu0"}')
    assert bad.returncode == 1, bad.stdout[-2000:] + bad.stderr[-2000:]
    assert "device of stage 'pool' must be 'cpu' or 'cuda:N', got 'gpu0'" in bad.stderr
    done = xgr("migrate", "export", *common)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "pool: TorchCall on stage_pool.pt2 (cpu" in done.stdout
    assert "reloaded with TF + custom_ops: equal to TF" in done.stdout
    parity = xgr("parity", "--saved_model", str(tmp_path / "sm"), "--data",
                 str(root / "batches.npz"), "--report_dir", str(tmp_path / "report"))
    assert parity.returncode == 0, parity.stdout[-2000:] + parity.stderr[-2000:]
    assert "parity PASSED" in parity.stdout and "Torch stages: ['pool']" in parity.stdout
    report = (tmp_path / "report" / "parity_report.md").read_text()
    assert "| pool | output | float32 | 4x4 |" in report and "| torch |" in report
