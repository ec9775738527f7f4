"""XgrAssemblePrompt and its Torch twin: layout, segments, truncation and bad inputs."""

import numpy as np
import pytest
import tensorflow as tf
import torch
from absl.testing import parameterized

from xgr_common.errors import InvalidInputError
from xgr_common.layout import TokenLayout

LAYOUT = TokenLayout(levels=2, codebook_size=10, code_base=20)
SPECIALS = dict(bos_id=LAYOUT.bos_id, profile_start_id=LAYOUT.profile_start_id,
                item_start_id=LAYOUT.item_start_id, pad_id=LAYOUT.pad_id)
B, P, I, X = LAYOUT.bos_id, LAYOUT.profile_start_id, LAYOUT.item_start_id, LAYOUT.pad_id
CONTEXT = [[9], [8]]
# Row 0 has two items (20,31) then (22,33); row 1 has none.
ITEMS = [[20, 31], [22, 33]]
SPLITS = [0, 2, 2]


class AssemblePromptTest(parameterized.TestCase):

    @pytest.fixture(autouse=True)
    def _fixtures(self, ops, twins):
        self.ops, self.twins = ops, twins

    def both(self, context, items, splits, **attrs):
        args = [np.asarray(x, np.int64).reshape(shape) for x, shape in
                ((context, (len(context), -1) if len(context) else (0, 1)),
                 (items, (-1, 2)), (splits, (-1,)))]
        tf_out = self.ops.assemble_prompt(*args, **SPECIALS, **attrs)
        th_out = self.twins.assemble_prompt(*map(torch.from_numpy, args), **SPECIALS, **attrs)
        return tf_out, th_out

    def check(self, outputs, tokens, lengths, segments):
        for out in outputs:
            np.testing.assert_array_equal(np.asarray(out.token_ids), tokens)
            np.testing.assert_array_equal(np.asarray(out.lengths), lengths)
            np.testing.assert_array_equal(np.asarray(out.segment_ids), segments)
            self.assertEqual(np.asarray(out.token_ids).dtype, np.int32)

    def test_layout_and_segments(self):
        self.check(self.both(CONTEXT, ITEMS, SPLITS),
                   tokens=[[B, P, 9, I, 20, 31, I, 22, 33, I],
                           [B, P, 8, I, X, X, X, X, X, X]],
                   lengths=[10, 4],
                   segments=[[0, 0, 0, 1, 1, 1, 2, 2, 2, 3],
                             [0, 0, 0, 1, -1, -1, -1, -1, -1, -1]])

    def test_max_length_pads_to_fixed_width(self):
        self.check(self.both(CONTEXT, ITEMS, SPLITS, max_length=12),
                   tokens=[[B, P, 9, I, 20, 31, I, 22, 33, I, X, X],
                           [B, P, 8, I, X, X, X, X, X, X, X, X]],
                   lengths=[10, 4],
                   segments=[[0, 0, 0, 1, 1, 1, 2, 2, 2, 3, -1, -1],
                             [0, 0, 0, 1] + [-1] * 8])

    @parameterized.parameters(7, 8, 9)
    def test_max_length_drops_oldest_whole_items(self, max_length):
        # 4 fixed tokens + one 3-token item fit in 7..9; the newest item (22, 33) stays.
        self.check(self.both(CONTEXT, ITEMS, SPLITS, max_length=max_length),
                   tokens=[[B, P, 9, I, 22, 33, I] + [X] * (max_length - 7),
                           [B, P, 8, I] + [X] * (max_length - 4)],
                   lengths=[7, 4],
                   segments=[[0, 0, 0, 1, 1, 1, 2] + [-1] * (max_length - 7),
                             [0, 0, 0, 1] + [-1] * (max_length - 4)])

    def test_max_length_keeping_no_items(self):
        self.check(self.both(CONTEXT, ITEMS, SPLITS, max_length=5),
                   tokens=[[B, P, 9, I, X], [B, P, 8, I, X]], lengths=[4, 4],
                   segments=[[0, 0, 0, 1, -1], [0, 0, 0, 1, -1]])

    def test_empty_batch(self):
        for out in self.both([], [], [0]):
            self.assertEqual(tuple(np.asarray(out.token_ids).shape), (0, 0))

    def test_graph_shape_is_static_with_max_length(self):
        fn = tf.function(lambda c, t, s: self.ops.assemble_prompt(
            c, t, s, **SPECIALS, max_length=16)).get_concrete_function(
                tf.TensorSpec([None, 3], tf.int64), tf.TensorSpec([None, 2], tf.int64),
                tf.TensorSpec([None], tf.int64))
        self.assertEqual(fn.output_shapes.token_ids.as_list(), [None, 16])

    @parameterized.named_parameters(
        ("too_short_for_fixed_part", dict(max_length=3), "cannot hold even a prompt"),
        ("context_rows", dict(context=[[9]]), "one row per prompt"),
        ("negative_token", dict(items=[[20, -1], [22, 33]]), "item_tokens values must lie"),
        ("token_beyond_int32", dict(context=[[2**31], [8]]), "context_tokens values must lie"),
        ("splits_past_end", dict(splits=[0, 2, 3]), "item_row_splits must end"),
        ("splits_decreasing", dict(splits=[0, 3, 2]), "non-decreasing"),
    )
    def test_rejects_bad_input(self, override, message):
        kwargs = dict(context=CONTEXT, items=ITEMS, splits=SPLITS)
        kwargs.update(override)
        max_length = kwargs.pop("max_length", 0)
        args = [np.asarray(kwargs["context"], np.int64), np.asarray(kwargs["items"], np.int64),
                np.asarray(kwargs["splits"], np.int64)]
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, message):
            self.ops.assemble_prompt(*args, **SPECIALS, max_length=max_length)
        with self.assertRaisesRegex(InvalidInputError, message):
            self.twins.assemble_prompt(*map(torch.from_numpy, args), **SPECIALS,
                                       max_length=max_length)

    def test_rejects_zero_levels_and_bad_special_ids(self):
        args = [np.zeros((1, 1), np.int64), np.zeros((0, 0), np.int64), np.zeros(2, np.int64)]
        args[2][1] = 0
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "at least one level"):
            self.ops.assemble_prompt(*args, **SPECIALS)
        with self.assertRaisesRegex(InvalidInputError, "at least one level"):
            self.twins.assemble_prompt(*map(torch.from_numpy, args), **SPECIALS)
        bad = dict(SPECIALS, pad_id=2**31)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "pad_id"):
            self.ops.load_library("feature_ops").xgr_assemble_prompt(*args, **bad, max_length=0)
        with self.assertRaisesRegex(InvalidInputError, "pad_id"):  # the wrapper checks first
            self.ops.assemble_prompt(*args, **bad)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "max_length"):
            self.ops.load_library("feature_ops").xgr_assemble_prompt(
                *args, **SPECIALS, max_length=2**20 + 1)
        with self.assertRaisesRegex(InvalidInputError, "max_length"):
            self.twins.assemble_prompt(*map(torch.from_numpy, args), **SPECIALS,
                                       max_length=2**20 + 1)
        with self.assertRaisesRegex(InvalidInputError, "pad_id"):
            self.twins.assemble_prompt(*map(torch.from_numpy, args), **bad)
