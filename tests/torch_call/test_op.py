"""TorchCall runs both package formats like torch does, in eager, tf.function and while loops."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import tensorflow as tf
import torch

from custom_ops.torch_call import torch_call
from xgr_common.errors import InvalidInputError
from xgr_common.tolerances import TOLERANCES

FLOAT = TOLERANCES["float32"]


def _inputs(batch: int, length: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, 4)).astype(np.float32)
    ids = rng.integers(0, 1000, size=(batch, length), dtype=np.int64)
    return x, ids


def _reference(module, x, ids):
    """float64 reference of the float head, exact int64 head."""
    with torch.no_grad():
        y64, z = copy.deepcopy(module).double()(torch.from_numpy(x).double(),
                                                torch.from_numpy(ids))
    return y64.numpy(), z.numpy()


@pytest.mark.parametrize("batch,length", [(1, 1), (8, 5), (1024, 3)])
def test_matches_torch_reference(package, two_heads, batch, length):
    x, ids = _inputs(batch, length)
    y, z = torch_call(str(package.path), [x, ids], [tf.float32, tf.int64])
    y_ref, z_ref = _reference(two_heads, x, ids)
    assert y.dtype == tf.float32 and y.shape == (batch, 3)
    np.testing.assert_allclose(y.numpy(), y_ref, atol=FLOAT.atol, rtol=FLOAT.rtol)
    np.testing.assert_array_equal(z.numpy(), z_ref)


def test_inside_tf_function_and_while_loop(package, two_heads):
    x, ids = _inputs(16, 4)
    path = str(package.path)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32),
                                  tf.TensorSpec([None, None], tf.int64)])
    def repeated(x, ids):
        # Feed the int64 head back into itself three times inside one graph.
        def body(i, ids):
            _, z = torch_call(path, [x, ids], [tf.float32, tf.int64],
                              output_shapes=[[None, 3], [None, None]])
            return i + 1, z
        return tf.while_loop(lambda i, _: i < 3, body, (tf.constant(0), ids))[1]

    want = torch.from_numpy(ids)
    for _ in range(3):
        want = two_heads(torch.from_numpy(x), want)[1]
    np.testing.assert_array_equal(repeated(x, ids).numpy(), want.numpy())


def test_output_shapes_feed_shape_inference(packages):
    aoti_two_heads = packages["two_heads_aoti"]
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32),
                                  tf.TensorSpec([None, 2], tf.int64)])
    def call(x, ids):
        y, z = torch_call(str(aoti_two_heads.path), [x, ids], [tf.float32, tf.int64],
                          output_shapes=[[None, 3], [None, 2]])
        assert y.shape.as_list() == [None, 3] and z.shape.as_list() == [None, 2]
        return y

    assert call(*_inputs(2, 2)).shape == (2, 3)


def test_asset_path_is_accepted(packages):
    script_two_heads = packages["two_heads_script"]
    asset = tf.saved_model.Asset(str(script_two_heads.path))
    y, _ = torch_call(asset, list(_inputs(3, 2)), [tf.float32, tf.int64])
    assert y.shape == (3, 3)


def test_wrapper_rejects_bad_declarations(packages):
    script_two_heads = packages["two_heads_script"]
    with pytest.raises(InvalidInputError, match="output_dtypes"):
        torch_call(str(script_two_heads.path), list(_inputs(2, 2)), [])
    with pytest.raises(InvalidInputError, match="output_dtypes\\[0\\]"):
        torch_call(str(script_two_heads.path), list(_inputs(2, 2)), [tf.string])
    with pytest.raises(InvalidInputError, match="output_shapes has 1 entries for 2"):
        torch_call(str(script_two_heads.path), list(_inputs(2, 2)), [tf.float32, tf.int64],
                   output_shapes=[[None, 3]])
