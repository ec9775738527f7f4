"""XgrSplitHistory and its Torch twin: hand-written cases, random cases against a plain-Python
reference, the frozen long-term part across a user's requests, and bad inputs."""

import numpy as np
import pytest
import tensorflow as tf
import torch

from xgr_common.errors import InvalidInputError

I64 = np.int64
DAY = 100   # block_seconds of the hand cases


def _both(ops, twins, values, times, splits, request, **attrs):
    """(TF op outputs, twin outputs) as lists of int64 arrays."""
    arrays = [np.asarray(x, I64) for x in (values, times, splits, request)]
    tf_out = [t.numpy() for t in ops.split_history(*arrays, **attrs)]
    th_out = [t.numpy() for t in twins.split_history(*map(torch.from_numpy, arrays), **attrs)]
    return tf_out, th_out


def reference(values, times, splits, request, *, block_seconds, long_term_blocks,
              long_term_items, recent_items):
    """The op's rules row by row in plain Python (the docstring of split_history_op.cc)."""
    long_all, long_splits, recent_all, recent_splits = [], [0], [], [0]
    for b in range(len(splits) - 1):
        open_block = request[b] // block_seconds
        kept = []   # (value, block)
        for i in range(splits[b], splits[b + 1]):
            if times[i] > request[b]:
                continue
            block = times[i] // block_seconds
            if block < open_block - long_term_blocks:
                continue
            if kept and kept[-1][1] == block and kept[-1][0] == values[i]:
                kept.pop()
            kept.append((values[i], block))
        recent = [v for v, k in kept if k == open_block][-recent_items:]
        closed = [(v, k) for v, k in kept if k != open_block]
        blocks = sorted({k for _, k in closed}, reverse=True)
        chosen = []
        for k in blocks:
            members = [v for v, kk in closed if kk == k]
            if len(chosen) + len(members) <= long_term_items:
                chosen = members + chosen
            else:
                if not chosen:
                    chosen = members[len(members) - long_term_items:] if long_term_items else []
                break
        long_all += chosen
        long_splits.append(len(long_all))
        recent_all += recent
        recent_splits.append(len(recent_all))
    return [np.asarray(x, I64) for x in (long_all, long_splits, recent_all, recent_splits)]


ATTRS = dict(block_seconds=DAY, long_term_blocks=3, long_term_items=4, recent_items=2)


@pytest.mark.parametrize("case,want", [
    # Blocks 7 (open: request 750), 6, 5, 3 (retired: older than the 3 closed blocks).
    (([1, 2, 3, 4, 5, 6], [350, 520, 610, 640, 700, 749], [0, 6], [750]),
     ([2, 3, 4], [0, 3], [5, 6], [0, 2])),
    # The newest closed block alone is over the budget: its newest 4 events.
    (([1, 2, 3, 4, 5, 6], [600, 601, 602, 603, 604, 750], [0, 6], [760]),
     ([2, 3, 4, 5], [0, 4], [6], [0, 1])),
    # A run of equal values collapses inside its block, not across blocks; future dropped.
    (([9, 9, 9, 8, 8], [590, 600, 610, 700, 800], [0, 5], [750]),
     ([9, 9], [0, 2], [8], [0, 1])),
    # Recent keeps the newest two of the open block; empty rows stay empty.
    (([1, 2, 3, 4], [700, 710, 720, 730], [0, 0, 4], [0, 735]),
     ([], [0, 0, 0], [3, 4], [0, 0, 2])),
], ids=["blocks_and_retirement", "newest_block_cut", "runs_inside_blocks", "recent_cap"])
def test_hand_cases(ops, twins, case, want):
    tf_out, th_out = _both(ops, twins, *case, **ATTRS)
    for got_tf, got_th, expected in zip(tf_out, th_out, want):
        np.testing.assert_array_equal(got_tf, np.asarray(expected, I64))
        np.testing.assert_array_equal(got_th, np.asarray(expected, I64))


@pytest.mark.parametrize("seed", range(30))
def test_random_cases_equal_the_reference(ops, twins, seed):
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(1, 6))
    lengths = rng.integers(0, 25, rows)
    splits = np.concatenate([[0], np.cumsum(lengths)])
    times = np.concatenate([np.sort(rng.integers(-500, 1500, n)) for n in lengths]
                           ).astype(I64) if splits[-1] else np.zeros(0, I64)
    values = rng.integers(0, 4, splits[-1]).astype(I64)   # few values: runs happen
    request = rng.integers(-300, 1600, rows).astype(I64)
    attrs = dict(block_seconds=int(rng.integers(1, 400)),
                 long_term_blocks=int(rng.integers(1, 6)),
                 long_term_items=int(rng.integers(0, 12)), recent_items=int(rng.integers(1, 6)))
    want = reference(values.tolist(), times.tolist(), splits.tolist(), request.tolist(), **attrs)
    tf_out, th_out = _both(ops, twins, values, times, splits, request, **attrs)
    for got_tf, got_th, expected in zip(tf_out, th_out, want):
        np.testing.assert_array_equal(got_tf, expected)
        np.testing.assert_array_equal(got_th, expected)


def test_the_long_term_part_is_frozen_until_the_block_closes(ops, twins):
    """One user's requests through a block: new events and a later request time change the
    recent part only; the long-term part changes when the request time enters the next block
    (its newest closed block joins, the oldest may retire)."""
    rng = np.random.default_rng(0)
    times = np.sort(rng.integers(0, 1000, 40)).astype(I64)
    values = rng.integers(0, 50, 40).astype(I64)
    seen = []
    for request in range(1000, 1100, 7):   # one open block: 1000 .. 1099
        new = np.arange(1000, request + 1, 7, dtype=I64)
        history_t = np.concatenate([times, new])
        history_v = np.concatenate([values, rng.integers(50, 60, new.size).astype(I64)])
        tf_out, th_out = _both(ops, twins, history_v, history_t, [0, history_v.size], [request],
                               **ATTRS)
        assert all(np.array_equal(a, b) for a, b in zip(tf_out, th_out))
        seen.append(tf_out[0].tobytes())
        assert tf_out[2].size == min(2, new.size)
    assert len(set(seen)) == 1
    # The next block: the events of block 10 are the newest closed block now.
    later, _ = _both(ops, twins, history_v, history_t, [0, history_v.size], [1100], **ATTRS)
    assert later[0].tobytes() != seen[0]
    assert set(later[0].tolist()) <= set(history_v[-new.size:].tolist())


@pytest.mark.parametrize("attrs,message", [
    (dict(ATTRS, block_seconds=0), "block_seconds"),
    (dict(ATTRS, long_term_blocks=0), "long_term_blocks"),
    (dict(ATTRS, long_term_items=-1), "long_term_items"),
    (dict(ATTRS, recent_items=0), "recent_items"),
])
def test_bad_attributes_are_named(ops, twins, attrs, message):
    args = [np.asarray(x, I64) for x in ([1], [1], [0, 1], [5])]
    with pytest.raises(InvalidInputError, match=message):
        ops.split_history(*args, **attrs)
    with pytest.raises(InvalidInputError, match=message):
        twins.split_history(*map(torch.from_numpy, args), **attrs)


@pytest.mark.parametrize("inputs,message", [
    (([1, 2], [5, 4], [0, 2], [9]), "non-decreasing"),
    (([1, 2], [5], [0, 2], [9]), "timestamps must have the length of values"),
    (([1, 2], [4, 5], [0, 3], [9]), "row_splits"),
    (([1, 2], [4, 5], [0, 2], [9, 9]), "request_time must have one entry per row"),
])
def test_bad_inputs_are_invalid_argument(ops, twins, inputs, message):
    args = [np.asarray(x, I64) for x in inputs]
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        ops.split_history(*args, **ATTRS)
    with pytest.raises(InvalidInputError):
        twins.split_history(*map(torch.from_numpy, args), **ATTRS)


def test_extreme_times_do_not_overflow(ops, twins):
    lo, hi = -2 ** 63, 2 ** 63 - 1
    attrs = dict(block_seconds=2 ** 62, long_term_blocks=2 ** 40, long_term_items=5,
                 recent_items=5)
    tf_out, th_out = _both(ops, twins, [1, 2, 3], [lo, 0, hi], [0, 3], [hi], **attrs)
    want = reference([1, 2, 3], [lo, 0, hi], [0, 3], [hi], **attrs)
    for got_tf, got_th, expected in zip(tf_out, th_out, want):
        np.testing.assert_array_equal(got_tf, expected)
        np.testing.assert_array_equal(got_th, expected)
