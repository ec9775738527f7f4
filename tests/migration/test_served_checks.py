"""The checks of a served migrated model that need no compiled package: a request's inputs
against the shapes the model declares (through a saved and reloaded SavedModel, as a server
runs it), and the devices an export places its Torch stages on."""

from __future__ import annotations

import pytest
import tensorflow as tf

from bridge.migration.served_stage import model_input_checks
from xgr_common.errors import ExportError
from xgr_export.migrated_model import MigratedExportConfig, _check_devices

SPECS = {"history": tf.TensorSpec((None, None), tf.int32, name="history"),
         "user": tf.TensorSpec((None, 3), tf.float32, name="user")}
READERS = {"history": "item_embedding", "user": "features"}


class _Checked(tf.Module):
    """Checks its inputs as the migrated walk does, then reads them as a model would (a
    reduction over dimension 1 fails on a rank-1 input, with TF's own message)."""

    @tf.function(input_signature=[SPECS])
    def serve(self, inputs):
        checks = [c for name, spec in SPECS.items()
                  for c in model_input_checks(name, inputs[name], spec, READERS[name])]
        with tf.control_dependencies(checks):
            inputs = {name: tf.identity(value) for name, value in inputs.items()}
        return {"out": tf.reduce_sum(tf.cast(inputs["history"], tf.float32), 1)
                + tf.reduce_sum(inputs["user"], 1)}


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    folder = tmp_path_factory.mktemp("checked")
    module = _Checked()
    tf.saved_model.save(module, str(folder), signatures={
        "serving_default": module.serve.get_concrete_function()})
    return tf.saved_model.load(str(folder)).signatures["serving_default"]


def test_requests_the_model_declares_pass(serve):
    got = serve(history=tf.ones([2, 5], tf.int32), user=tf.ones([2, 3]))["out"]
    assert got.numpy().tolist() == [8.0, 8.0]
    assert serve(history=tf.ones([1, 1], tf.int32), user=tf.ones([1, 3]))["out"].shape == [1]


@pytest.mark.parametrize("history, user, message", [
    ([2, 5], [2, 4], "stage features: input user must have size 3 in dimension 1 (the model "
                     "declares shape (None, 3))"),
    ([2], [2, 3], "stage item_embedding: input history must have rank 2 (the model declares "
                  "shape (None, None))"),
    ([2, 5, 1], [2, 3], "stage item_embedding: input history must have rank 2"),
    ([2, 5], [2], "stage features: input user must have rank 2"),
    ([2, 5], [2, 3, 1], "stage features: input user must have rank 2"),
])
def test_a_shape_the_model_does_not_declare_is_refused_naming_the_stage_and_the_input(
        serve, history, user, message):
    # The signature takes any shape of its dtype, and TF's optimizer folds the ranks and
    # sizes it believes known: the checks must still see the request's.
    with pytest.raises(tf.errors.InvalidArgumentError) as refused:
        serve(history=tf.ones(history, tf.int32), user=tf.ones(user))
    assert message in refused.value.message


def _config(tmp_path, **devices):
    return MigratedExportConfig(plan=tmp_path / "plan.json", out=tmp_path / "out",
                                data=tmp_path / "batches.npz", devices=devices)


def test_a_cuda_stage_on_a_machine_without_cuda_is_refused_naming_it(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ExportError, match=r"stages \['pool'\] are placed on cuda:0, but this "
                                          r"machine has no CUDA device"):
        _check_devices(_config(tmp_path, pool="cuda:0"), ["pool", "score"])
    _check_devices(_config(tmp_path), ["pool", "score"])   # all on the CPU: nothing to check


def test_a_cuda_index_past_the_machines_devices_is_refused(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    _check_devices(_config(tmp_path, pool="cuda:1"), ["pool", "score"])
    with pytest.raises(ExportError, match=r"stages \['score'\] are placed on cuda:2, but this "
                                          r"machine has 2 CUDA devices \(cuda:0 to cuda:1\)"):
        _check_devices(_config(tmp_path, pool="cuda:1", score="cuda:2"), ["pool", "score"])
