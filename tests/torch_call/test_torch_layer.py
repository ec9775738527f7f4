"""The development path runs Torch inside TF in process, and its SavedModel fails elsewhere
with a message that says why and how to export portably."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import torch

from bridge.torch_layer import TorchLayer, torch_function
from tests.child_env import child_env
from xgr_common.errors import BridgeError


def _scale_and_count(x, ids):
    return x * 3.0, (ids > 2).sum(dim=1)


def test_torch_function_in_eager_and_graph():
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    ids = tf.constant([[1, 5, 3], [0, 0, 9]], tf.int64)
    y, n = torch_function(_scale_and_count, [x, ids], [tf.float32, tf.int64])
    np.testing.assert_array_equal(y.numpy(), x.numpy() * 3)
    np.testing.assert_array_equal(n.numpy(), [2, 1])

    @tf.function
    def graph(x, ids):
        return torch_function(_scale_and_count, [x, ids], [tf.float32, tf.int64],
                              output_shapes=[[None, 3], [None]])

    y, n = graph(x, ids)
    np.testing.assert_array_equal(n.numpy(), [2, 1])


def test_keras_layer_single_output():
    layer = TorchLayer(lambda x: torch.relu(x), [tf.float32])
    out = layer(tf.constant([-1.0, 2.0]))
    np.testing.assert_array_equal(out.numpy(), [0.0, 2.0])


def test_wrong_output_dtype_is_reported():
    with pytest.raises(tf.errors.InvalidArgumentError, match="output 0: .*returned float32"):
        torch_function(lambda x: x * 2, [tf.constant([1.0])], [tf.int64])
    with pytest.raises(BridgeError, match="at least one output"):
        torch_function(lambda x: x, [tf.constant([1.0])], [])


@pytest.mark.heavy  # a SavedModel loaded in a fresh process
def test_saved_model_fails_elsewhere_with_an_explanation(tmp_path):
    module = tf.Module()
    module.layer = TorchLayer(lambda x: x + 1.0, [tf.float32], [[None]])
    module.serve = tf.function(lambda x: {"y": module.layer(x)},
                               input_signature=[tf.TensorSpec([None], tf.float32)])
    np.testing.assert_array_equal(module.serve(tf.constant([1.0]))["y"].numpy(), [2.0])
    tf.saved_model.save(module, str(tmp_path / "dev"),
                        signatures={"serving_default": module.serve.get_concrete_function()})
    code = ("import sys, tensorflow as tf; m = tf.saved_model.load(sys.argv[1]); "
            "m.signatures['serving_default'](x=tf.constant([1.0]))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "dev")],
                          env=child_env(TF_CPP_MIN_LOG_LEVEL="3"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "NOT PORTABLE" in done.stderr and "xgr export" in done.stderr, done.stderr[-2000:]
    assert "TorchCall" in done.stderr
