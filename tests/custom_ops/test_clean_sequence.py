"""XgrCleanSequence and its Torch twin on hand-written cases and bad inputs."""

import numpy as np
import pytest
import tensorflow as tf
import torch
from absl.testing import parameterized

from xgr_common.errors import InvalidInputError

I64 = np.int64

# (values, timestamps, row_splits, request_time, window, keep_last) -> (values, times, splits)
CASES = {
    "window_edges_inclusive": (
        ([1, 2, 3, 4], [90, 91, 100, 101], [0, 4], [100], 10, 10),
        ([1, 2, 3], [90, 91, 100], [0, 3])),
    "older_than_window_dropped": (
        ([1, 2], [89, 90], [0, 2], [100], 10, 10), ([2], [90], [0, 1])),
    "future_events_are_leakage": (
        ([1, 2, 3], [50, 100, 101], [0, 3], [100], 1000, 10), ([1, 2], [50, 100], [0, 2])),
    "duplicate_run_keeps_last_timestamp": (
        ([7, 7, 7, 8, 7], [1, 2, 3, 4, 5], [0, 5], [10], 100, 10),
        ([7, 8, 7], [3, 4, 5], [0, 3])),
    "run_formed_inside_window_only": (
        ([5, 5, 6], [1, 8, 9], [0, 3], [10], 5, 10), ([5, 6], [8, 9], [0, 2])),
    "keep_last_after_collapse": (
        ([1, 2, 2, 3, 4], [1, 2, 3, 4, 5], [0, 5], [10], 100, 2), ([3, 4], [4, 5], [0, 2])),
    "rows_are_independent": (
        ([9, 9, 9, 1], [1, 2, 3, 4], [0, 2, 2, 4], [5, 7, 100], 100, 5),
        ([9, 9, 1], [2, 3, 4], [0, 1, 1, 3])),
    "equal_values_across_rows_not_merged": (
        ([4, 4], [1, 1], [0, 1, 2], [1, 1], 1, 1), ([4, 4], [1, 1], [0, 1, 2])),
    "empty_batch": (([], [], [0], [], 1, 1), ([], [], [0])),
    "request_time_near_int64_min": (
        ([3], [-2**63], [0, 1], [-2**63 + 5], 10, 1), ([3], [-2**63], [0, 1])),
    "huge_window_and_keep_last": (
        ([0, 1, 2], [-2**62, -2**62 + 1, 2**62], [0, 3], [2**62], 2**63 - 1, 2**63 - 1),
        ([1, 2], [-2**62 + 1, 2**62], [0, 2])),
}


class CleanSequenceTest(parameterized.TestCase):

    @pytest.fixture(autouse=True)
    def _fixtures(self, ops, twins):
        self.ops, self.twins = ops, twins

    @parameterized.named_parameters(*((name, *case) for name, case in CASES.items()))
    def test_expected_output(self, inputs, expected):
        values, times, splits, request, window, keep = inputs
        arrays = [np.asarray(x, I64) for x in (values, times, splits, request)]
        tf_out = self.ops.clean_sequence(*arrays, window_seconds=window, keep_last=keep)
        th_out = self.twins.clean_sequence(*map(torch.from_numpy, arrays),
                                           window_seconds=window, keep_last=keep)
        for got_tf, got_th, want in zip(tf_out, th_out, expected):
            np.testing.assert_array_equal(got_tf.numpy(), np.asarray(want, I64))
            np.testing.assert_array_equal(got_th.numpy(), np.asarray(want, I64))
            self.assertEqual(got_th.dtype, torch.int64)

    @parameterized.named_parameters(
        ("splits_not_starting_at_zero", dict(row_splits=[1, 2]), "row_splits must start at 0"),
        ("splits_decreasing", dict(row_splits=[0, 2, 1, 2]), "row_splits must be non-decreasing"),
        ("splits_not_ending_at_len", dict(row_splits=[0, 1]), "row_splits must end"),
        ("splits_empty", dict(row_splits=[]), "at least one entry"),
        ("timestamps_length", dict(timestamps=[1]), "timestamps must have the length"),
        ("request_time_size", dict(request_time=[5, 6]), "request_time must have one entry"),
        ("timestamps_decreasing", dict(timestamps=[3, 2]), "non-decreasing inside each row"),
        ("values_rank", dict(values=[[1, 2]]), "values must have rank 1"),
    )
    def test_rejects_bad_input(self, override, message):
        inputs = dict(values=[1, 2], timestamps=[1, 2], row_splits=[0, 2], request_time=[5])
        inputs.update(override)
        arrays = {k: np.asarray(v, I64) for k, v in inputs.items()}
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, message):
            self.ops.clean_sequence(**arrays, window_seconds=10, keep_last=3)
        with self.assertRaisesRegex(InvalidInputError, message):
            self.twins.clean_sequence(**{k: torch.from_numpy(v) for k, v in arrays.items()},
                                      window_seconds=10, keep_last=3)

    @parameterized.parameters(dict(window_seconds=0), dict(keep_last=0), dict(keep_last=-4))
    def test_rejects_bad_attributes(self, **attrs):
        kwargs = {"window_seconds": 10, "keep_last": 3, **attrs}
        arrays = [np.asarray(x, I64) for x in ([1], [1], [0, 1], [5])]
        with self.assertRaises((tf.errors.InvalidArgumentError, ValueError)):
            self.ops.clean_sequence(*arrays, **kwargs)
        with self.assertRaisesRegex(InvalidInputError, "attribute"):
            self.twins.clean_sequence(*map(torch.from_numpy, arrays), **kwargs)

    def test_graph_mode_shapes(self):
        spec = tf.TensorSpec([None], tf.int64)
        fn = tf.function(lambda v, t, s, r: self.ops.clean_sequence(
            v, t, s, r, window_seconds=5, keep_last=2)).get_concrete_function(
                spec, spec, tf.TensorSpec([4], tf.int64), tf.TensorSpec([3], tf.int64))
        self.assertEqual(fn.output_shapes.row_splits.as_list(), [4])
        self.assertEqual(fn.output_shapes.values.as_list(), [None])
        with self.assertRaises(ValueError):  # shape function: row_splits must be [B+1]
            tf.function(lambda s, r: self.ops.clean_sequence(
                [1], [1], s, r, window_seconds=5, keep_last=2)).get_concrete_function(
                    tf.TensorSpec([4], tf.int64), tf.TensorSpec([2], tf.int64))

    def test_twin_rejects_mixed_devices(self):
        on_meta = torch.zeros(2, dtype=torch.int64, device="meta")
        with self.assertRaisesRegex(InvalidInputError, "one device"):
            self.twins.clean_sequence(on_meta, torch.tensor([1, 2]), torch.tensor([0, 2]),
                                      torch.tensor([5]), window_seconds=10, keep_last=3)
