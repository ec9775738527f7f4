"""XgrAssemblePromptV2 and its Torch twin: a hand-written row, random cases against a
plain-Python reference, the frozen prefix across two requests of one user (with the history
split), and bad inputs."""

import numpy as np
import pytest
import tensorflow as tf
import torch

from xgr_common.errors import InvalidInputError

I64 = np.int64
IDS = dict(bos_id=1, profile_start_id=5, item_start_id=4, soft_id=6, pad_id=0)


def _both(ops, twins, long_items, long_splits, context, recent_items, recent_splits, **attrs):
    arrays = [np.asarray(x, I64) for x in (long_items, long_splits, context, recent_items,
                                           recent_splits)]
    tf_out = [t.numpy() for t in ops.assemble_prompt_v2(*arrays, **attrs)]
    th_out = [t.numpy() for t in twins.assemble_prompt_v2(*map(torch.from_numpy, arrays),
                                                          **attrs)]
    return tf_out, th_out


def reference(long_items, long_splits, context, recent_items, recent_splits, *, bos_id,
              profile_start_id, item_start_id, soft_id, pad_id, soft_tokens, intro=(),
              before_profile=(), before_recent=(), question=(), max_length=0):
    """The layout of assemble_prompt_v2_op.cc, row by row in plain Python."""
    rows = []
    for b in range(len(long_splits) - 1):
        row = [(bos_id, 0)] + [(t, 0) for t in intro]
        longs = long_items[long_splits[b]:long_splits[b + 1]]
        recents = recent_items[recent_splits[b]:recent_splits[b + 1]]
        n, m = len(longs), len(recents)
        for k, codes in enumerate(longs):
            row += [(item_start_id, 1 + k)] + [(c, 1 + k) for c in codes]
        frozen = len(row)
        profile = (list(before_profile) + [soft_id] * soft_tokens + [profile_start_id]
                   + list(context[b]) + list(before_recent))
        row += [(t, n + 1) for t in profile]
        for k, codes in enumerate(recents):
            row += [(item_start_id, n + 2 + k)] + [(c, n + 2 + k) for c in codes]
        row += [(t, n + m + 2) for t in list(question) + [item_start_id]]
        rows.append((row, frozen))
    length = max_length or max((len(r) for r, _ in rows), default=0)
    tokens = np.full((len(rows), length), pad_id, I64)
    segments = np.full((len(rows), length), -1, I64)
    for b, (row, _) in enumerate(rows):
        tokens[b, :len(row)] = [t for t, _ in row]
        segments[b, :len(row)] = [s for _, s in row]
    return [tokens, np.asarray([len(r) for r, _ in rows], I64), segments,
            np.asarray([f for _, f in rows], I64)]


def test_a_row_in_the_documented_layout(ops, twins):
    attrs = dict(IDS, soft_tokens=2, intro=[100, 101], before_profile=[102],
                 before_recent=[103], question=[104, 105])
    tf_out, th_out = _both(ops, twins, [[10, 20], [11, 21]], [0, 2], [[50]], [[12, 22]], [0, 1],
                           **attrs)
    want_tokens = [1, 100, 101, 4, 10, 20, 4, 11, 21, 102, 6, 6, 5, 50, 103, 4, 12, 22, 104,
                   105, 4]
    want_segments = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 3, 4, 4, 4, 5, 5, 5]
    for out in (tf_out, th_out):
        np.testing.assert_array_equal(out[0][0], want_tokens)
        np.testing.assert_array_equal(out[2][0], want_segments)
        assert out[1][0] == len(want_tokens) and out[3][0] == 9


@pytest.mark.parametrize("seed", range(25))
def test_random_cases_equal_the_reference(ops, twins, seed):
    rng = np.random.default_rng(seed)
    rows, levels = int(rng.integers(0, 5)), int(rng.integers(1, 4))
    long_splits = np.concatenate([[0], np.cumsum(rng.integers(0, 4, rows))]).astype(I64)
    recent_splits = np.concatenate([[0], np.cumsum(rng.integers(0, 3, rows))]).astype(I64)
    long_items = rng.integers(0, 1000, (long_splits[-1], levels)).astype(I64)
    recent_items = rng.integers(0, 1000, (recent_splits[-1], levels)).astype(I64)
    context = rng.integers(0, 1000, (rows, int(rng.integers(0, 3)))).astype(I64)
    spans = {name: rng.integers(0, 900, int(rng.integers(0, 3))).tolist()
             for name in ("intro", "before_profile", "before_recent", "question")}
    attrs = dict(IDS, soft_tokens=int(rng.integers(0, 3)), **spans)
    want = reference(long_items.tolist(), long_splits.tolist(), context.tolist(),
                     recent_items.tolist(), recent_splits.tolist(), **attrs)
    if rows and rng.random() < 0.5:
        attrs["max_length"] = want[0].shape[1] + int(rng.integers(0, 4))
        want = reference(long_items.tolist(), long_splits.tolist(), context.tolist(),
                         recent_items.tolist(), recent_splits.tolist(), **attrs)
    tf_out, th_out = _both(ops, twins, long_items, long_splits, context, recent_items,
                           recent_splits, **attrs)
    for got_tf, got_th, expected in zip(tf_out, th_out, want):
        np.testing.assert_array_equal(got_tf, expected)
        np.testing.assert_array_equal(got_th, expected)


def test_the_frozen_prefix_is_bit_identical_across_a_users_requests(ops, twins):
    """Two requests of one user in one time block: different recent events (a new click),
    a different request time and a different context. The split history's long-term part and
    the prompt's frozen prefix are the same, token for token, through the op and the twin."""
    split = dict(block_seconds=100, long_term_blocks=4, long_term_items=6, recent_items=3)
    attrs = dict(IDS, soft_tokens=2, intro=[100], before_profile=[101], question=[102])
    times = np.array([110, 150, 220, 260, 330, 390, 410, 420], I64)
    items = np.array([7, 8, 9, 7, 6, 5, 3, 2], I64)
    prompts = []
    for extra, request, country in (([], 430, 11), ([440], 445, 12)):
        t = np.concatenate([times, np.asarray(extra, I64)])
        v = np.concatenate([items, np.full(len(extra), 9, I64)])
        for side in (ops, twins):
            cast = (lambda x: x) if side is ops else torch.from_numpy
            part = side.split_history(cast(v), cast(t), cast(np.array([0, v.size], I64)),
                                      cast(np.array([request], I64)), **split)
            codes = lambda values: np.stack([values * 10 + level for level in range(3)], 1)
            long_codes = codes(np.asarray(part.long_values))
            recent_codes = codes(np.asarray(part.recent_values))
            out = side.assemble_prompt_v2(
                cast(long_codes), cast(np.asarray(part.long_row_splits)),
                cast(np.array([[country]], I64)), cast(recent_codes),
                cast(np.asarray(part.recent_row_splits)), **attrs)
            frozen = int(np.asarray(out.frozen_lengths)[0])
            prompts.append((np.asarray(out.token_ids)[0], frozen))
    frozen = prompts[0][1]
    assert frozen > 1 + 1 + 4 and all(f == frozen for _, f in prompts)
    first = prompts[0][0][:frozen]
    assert all(np.array_equal(tokens[:frozen], first) for tokens, _ in prompts)
    assert not np.array_equal(prompts[0][0], prompts[2][0])   # the rest did change


@pytest.mark.parametrize("inputs,message", [
    (([[1, 2]], [0, 1], [[3]], [[1]], [0, 0]), "same number"),
    (([[1, 2]], [0, 2], [[3]], [[1, 2]], [0, 0]), "long_row_splits"),
    (([[1, 2]], [0, 1], [[3], [4]], [[1, 2]], [0, 1]), "same 1 rows"),
    (([[-1, 2]], [0, 1], [[3]], [[1, 2]], [0, 1]), "long_item_tokens"),
], ids=["levels", "splits", "rows", "negative_token"])
def test_bad_inputs_are_invalid_argument(ops, twins, inputs, message):
    arrays = [np.asarray(x, I64) for x in inputs]
    attrs = dict(IDS, soft_tokens=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ops.assemble_prompt_v2(*arrays, **attrs)
    with pytest.raises(InvalidInputError, match=message):
        twins.assemble_prompt_v2(*map(torch.from_numpy, arrays), **attrs)


def test_a_row_over_max_length_is_refused_not_cut(ops, twins):
    arrays = [np.asarray(x, I64) for x in ([[1, 2]] * 3, [0, 3], [[3]], [[1, 2]], [0, 1])]
    attrs = dict(IDS, soft_tokens=1, max_length=12)
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than max_length=12"):
        ops.assemble_prompt_v2(*arrays, **attrs)
    with pytest.raises(InvalidInputError, match="more than max_length=12"):
        twins.assemble_prompt_v2(*map(torch.from_numpy, arrays), **attrs)
    with pytest.raises(InvalidInputError, match="intro"):
        ops.assemble_prompt_v2(*arrays, **dict(attrs, intro=[-3]))
