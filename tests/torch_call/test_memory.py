"""Zero-copy in both directions, and copies exactly where adopting torch memory is unsafe."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
import torch

from custom_ops.torch_call import torch_call


def _address(tensor: tf.Tensor) -> int:
    return torch.from_dlpack(tensor).data_ptr()


def test_inputs_are_torch_views_of_the_tf_buffer(packages):
    x = tf.constant(np.arange(6, dtype=np.float32))
    (y,) = torch_call(str(packages["double_in_place"].path), [x], [tf.float32])
    # The package doubled its input in place: only a view of TF's buffer makes that visible.
    np.testing.assert_array_equal(x.numpy(), np.arange(6) * 2.0)
    np.testing.assert_array_equal(y.numpy(), np.arange(6) * 2.0)


def test_aligned_results_are_adopted_without_a_copy(packages):
    path = str(packages["table"].path)
    x = tf.ones([2])
    (first,) = torch_call(path, [x], [tf.float32])
    (second,) = torch_call(path, [x], [tf.float32])
    assert _address(first) == _address(second)  # both are the module's own buffer
    assert _address(first) % 64 == 0


def test_adopted_results_are_never_updated_in_place(packages):
    path = str(packages["table"].path)
    (first,) = torch_call(path, [tf.ones([2])], [tf.float32])
    bumped = tf.raw_ops.AddV2(x=first, y=tf.ones([1024]))  # may reuse an input it owns
    (again,) = torch_call(path, [tf.ones([2])], [tf.float32])
    np.testing.assert_array_equal(bumped.numpy(), np.arange(1024) + 1.0)
    np.testing.assert_array_equal(again.numpy(), np.arange(1024))


def test_unaligned_results_are_copied_and_safe_for_tf_kernels(packages):
    values = np.arange(1, 100, dtype=np.float32)
    (y,) = torch_call(str(packages["unaligned"].path), [values], [tf.float32])
    assert _address(y) % 64 == 0
    # Unaligned memory adopted by TF aborts Eigen kernels such as reduce_sum.
    assert float(tf.reduce_sum(y)) == float(values.sum())


def test_results_aliasing_an_input_outlive_it(packages):
    x = tf.constant(np.arange(5, dtype=np.float32))
    (y,) = torch_call(str(packages["identity"].path), [x], [tf.float32])
    assert _address(y) != _address(x)
    del x
    np.testing.assert_array_equal(y.numpy(), np.arange(5, dtype=np.float32))
