"""TorchCall checks a package's value rules on the host before it runs: a value that breaks a
rule is answered ``InvalidArgument`` naming the input, the rule and the row, no kernel sees it,
and the next request is answered normally. A package without the rules that fails on such a
value is the server's fault (``Internal``), not the caller's."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from custom_ops.torch_call import torch_call

OUT = [tf.int64, tf.float32]
VOCAB = 1024


def _request(rows: int = 3, width: int = 5):
    tokens = np.tile(np.arange(1, width + 1, dtype=np.int32), (rows, 1)) + 300
    lengths = np.full(rows, width, np.int32)
    lengths[-1] = width - 2
    exclude = np.full((rows, 2), -1, np.int64)
    return [tokens, lengths, exclude]


def _broken(change):
    inputs = _request()
    change(inputs)
    return inputs


CASES = {
    "token_above_vocab": (lambda x: x[0].__setitem__((1, 2), VOCAB),
                          r"input 0 \(token_ids\) breaks value rule token_range .*row 1 "
                          r"position 2 holds 1024 \(vocab_size 1024\)"),
    "negative_token": (lambda x: x[0].__setitem__((0, 0), -1),
                       r"breaks value rule token_range .*row 0 position 0 holds -1"),
    "zero_length": (lambda x: x[1].__setitem__(2, 0),
                    r"input 1 \(lengths\) breaks value rule lengths_positive .*row 2 has "
                    r"length 0"),
    "negative_length": (lambda x: x[1].__setitem__(0, -7),
                        r"breaks value rule lengths_positive .*row 0 has length -7"),
    "length_past_width": (lambda x: x[1].__setitem__(1, 6),
                          r"breaks value rule lengths_fit .*row 1 has length 6"),
    "bad_exclusion": (lambda x: x[2].__setitem__((1, 0), -5),
                      r"input 2 \(exclude_items\) breaks value rule exclusion_ids .*row 1 "
                      r"holds -5"),
}


def test_a_valid_request_runs(packages):
    items, scores = torch_call(str(packages["ruled_excluder"].path), _request(), OUT)
    assert items.shape == (3, 5) and np.isfinite(scores.numpy()).all()


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_broken_rule_is_invalid_argument_and_costs_the_next_request_nothing(packages, case):
    change, message = CASES[case]
    path = str(packages["ruled_excluder"].path)
    want = torch_call(path, _request(), OUT)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        torch_call(path, _broken(change), OUT)
    got = torch_call(path, _request(), OUT)
    np.testing.assert_array_equal(got[0], want[0])


def test_tokens_past_a_rows_length_are_not_checked(packages):
    """Padding is the engine's to ignore: only the first ``length`` tokens must be in range.
    (The ruled package's own toy model reads padding, so this runs the check alone: the bad
    padding of a shorter row of a valid batch.)"""
    inputs = _request()
    inputs[0][2, 4] = 0        # row 2 has length 3: position 4 is padding
    torch_call(str(packages["ruled_excluder"].path), inputs, OUT)


def test_without_the_rules_a_failing_package_is_a_server_fault(packages):
    inputs = _broken(CASES["token_above_vocab"][0])
    with pytest.raises(tf.errors.InternalError, match="torch failed running TorchScript package"):
        torch_call(str(packages["excluder"].path), inputs, OUT)
