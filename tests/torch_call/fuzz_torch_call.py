"""Hostile inputs through TorchCall with a real exported engine package, run in a child
process (``tests/fuzz_suite.py`` runs ``run(PACKAGE, SIGNATURE)`` for the check
``torch_call:PACKAGE:SIGNATURE``; SIGNATURE is a text file holding the package's contract).

Each case starts from a valid request drawn to the contract (rows, prompt width, tokens inside
the vocabulary, lengths, non-decreasing segments, finite soft vectors, exclusion ids) and, most
of the time, breaks it: hostile values (tokens at or past the vocabulary, negative, lengths 0 or
past the width, segments going back, NaN or infinite vectors, negative exclusion ids, prompts
past the model's positions), other dtypes and shapes, rows that disagree between inputs, too
many rows, inputs missing or added. Every case must end one of two ways:

* answered, with outputs of the contract's shapes and dtypes (item ids >= -1, scores finite or
  -inf where the id is -1 padding); a case drawn valid must be answered;
* ``InvalidArgumentError`` (the caller's mistake).

Any other error class (a server fault answered for a client's input) fails the run, and an
abort kills the child, which the parent counts. After the cases, the first valid request is
sent again and must get the same answer. The last line is
``surface torch_call cases=N accepted=A refused=R``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, given, settings, strategies as st

from custom_ops.torch_call import torch_call

EXAMPLES = int(os.environ.get("XGR_FUZZ_EXAMPLES", "500"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
OUT = [tf.int64, tf.float32]


@dataclass(frozen=True)
class Contract:
    """What the fuzzer needs of an engine package's signature text."""

    max_rows: int
    min_width: int      # the prompt dimension's lower bound
    max_exclude: int    # the exclusion dimension's upper bound
    soft: int
    hidden: int
    vocab: int
    max_position: int
    top_k: int

    @classmethod
    def parse(cls, text: str) -> "Contract":
        def number(pattern: str) -> int:
            found = re.search(pattern, text, re.M)
            if found is None:
                raise ValueError(f"the package signature lacks {pattern!r}:\n{text}")
            return int(found.group(1))

        embeds = re.search(r"^in float32 (\S+) (\d+) (\d+)$", text, re.M)
        inputs = re.findall(r"^in \S+ (.*)$", text, re.M)
        if embeds is None or len(inputs) != 5:
            raise ValueError(f"not an engine package's signature:\n{text}")
        bounds = {name: (int(low), int(high)) for name, low, high in
                  re.findall(r"^dim (\S+) (\d+) (\d+)$", text, re.M)}
        rows, width = inputs[0].split()
        return cls(max_rows=bounds[rows][1], min_width=bounds[width][0],
                   max_exclude=bounds[inputs[4].split()[1]][1], soft=int(embeds.group(2)),
                   hidden=int(embeds.group(3)), vocab=number(r"vocab=(\d+)"),
                   max_position=number(r"max_position=(\d+)"),
                   top_k=number(r"^out int64 \S+ (\d+)$"))


@st.composite
def valid_request(draw, contract: Contract) -> list[np.ndarray]:
    rows = draw(st.integers(1, 3))
    width = draw(st.integers(contract.min_width, contract.min_width + 10))
    tokens = np.array(draw(st.lists(st.integers(0, contract.vocab - 1), min_size=rows * width,
                                    max_size=rows * width)), np.int32).reshape(rows, width)
    lengths = np.array(draw(st.lists(st.integers(1, width), min_size=rows, max_size=rows)),
                       np.int32)
    steps = draw(st.lists(st.integers(0, 1), min_size=rows * width, max_size=rows * width))
    segments = np.cumsum(np.array(steps, np.int32).reshape(rows, width), axis=1, dtype=np.int32)
    embeds = np.array(draw(st.lists(st.floats(-4, 4, width=32), min_size=1, max_size=1)) *
                      (rows * contract.soft * contract.hidden), np.float32).reshape(
                          rows, contract.soft, contract.hidden)
    excluded = draw(st.integers(1, min(4, contract.max_exclude)))
    exclude = np.array(draw(st.lists(st.one_of(st.just(-1), st.integers(0, 2**40)),
                                     min_size=rows * excluded, max_size=rows * excluded)),
                       np.int64).reshape(rows, excluded)
    return [tokens, lengths, segments, embeds, exclude]


HOSTILE_TOKENS = st.sampled_from([-1, -(2**31), 2**31 - 1])
HOSTILE_LENGTHS = st.sampled_from([0, -1, -(2**31), 2**31 - 1])
HOSTILE_FLOATS = st.sampled_from([np.nan, np.inf, -np.inf, 3e38])
HOSTILE_EXCLUDE = st.sampled_from([-2, -(2**63), -1000])


def _at(draw, array: np.ndarray) -> tuple:
    if array.size == 0 or array.ndim == 0:
        raise ValueError("no element to change")   # an earlier change emptied it
    return tuple(draw(st.integers(0, size - 1)) for size in array.shape)


def mutate(draw, inputs: list, contract: Contract) -> list:
    """One hostile change to ``inputs`` (a list of numpy arrays, changed in place or
    replaced)."""
    tokens, lengths, segments, embeds, exclude = inputs
    rows, width = tokens.shape
    kind = draw(st.sampled_from(range(14)))
    if kind == 0:
        tokens[_at(draw, tokens)] = draw(st.one_of(HOSTILE_TOKENS, st.integers(
            contract.vocab, contract.vocab + 3)))
    elif kind == 1:
        lengths[_at(draw, lengths)] = draw(st.one_of(HOSTILE_LENGTHS, st.just(width + 1)))
    elif kind == 2:
        segments[_at(draw, segments)] = draw(st.sampled_from([-5, 999, -(2**31)]))
    elif kind == 3:
        embeds[_at(draw, embeds)] = draw(HOSTILE_FLOATS)
    elif kind == 4:
        exclude[_at(draw, exclude)] = draw(HOSTILE_EXCLUDE)
    elif kind == 5:   # a prompt past the model's positions
        width = contract.max_position + draw(st.integers(-contract.soft, 4))
        inputs[0] = np.ones((rows, width), np.int32)
        inputs[1] = np.full(rows, width, np.int32)
        inputs[2] = np.zeros((rows, width), np.int32)
    elif kind == 6:   # another dtype
        index = draw(st.integers(0, 4))
        inputs[index] = inputs[index].astype(draw(st.sampled_from(
            [np.int64, np.int32, np.float32, np.float64, np.int16, np.uint8])))
    elif kind == 7:   # a dimension added or dropped
        index = draw(st.integers(0, 4))
        inputs[index] = (inputs[index][..., None] if draw(st.booleans())
                         else inputs[index].reshape(-1)[:1].reshape(()))
    elif kind == 8:   # rows that disagree between inputs
        index = draw(st.integers(0, 4))
        inputs[index] = np.concatenate([inputs[index], inputs[index][:1]])
    elif kind == 9:   # more rows than the package takes, or none
        count = draw(st.sampled_from([0, contract.max_rows + 1]))
        for index, array in enumerate(inputs):
            inputs[index] = np.resize(array, (count, *array.shape[1:]))
    elif kind == 10:  # soft-prompt vectors of the wrong width or count
        shape = list(embeds.shape)
        shape[draw(st.integers(1, 2))] += draw(st.sampled_from([-1, 1]))
        inputs[3] = np.zeros([max(s, 0) for s in shape], np.float32)
    elif kind == 11:  # an input missing or one too many
        if draw(st.booleans()):
            inputs.pop(draw(st.integers(0, 4)))
        else:
            inputs.append(np.zeros(rows, np.int32))
    elif kind == 12:  # segment ids that go back
        if width > 1:
            segments[:, :] = np.arange(width, 0, -1, dtype=np.int32)
        else:
            segments[:, 0] = -1
    else:             # an empty prompt or exclusion width
        index = draw(st.sampled_from([0, 2, 4]))
        inputs[index] = inputs[index][:, :0]
    return inputs


@st.composite
def case(draw, contract: Contract) -> tuple[bool, list]:
    inputs = draw(valid_request(contract))
    changes = draw(st.integers(0, 3)) if draw(st.integers(0, 3)) else 0
    for _ in range(changes):
        try:
            inputs = mutate(draw, inputs, contract)
        except (ValueError, IndexError):
            pass   # this change does not apply to what earlier changes left
    return changes == 0, inputs


def _check_answer(outputs, rows: int, contract: Contract) -> None:
    items, scores = (o.numpy() for o in outputs)
    assert items.shape == (rows, contract.top_k) and items.dtype == np.int64, items.shape
    assert scores.shape == items.shape and scores.dtype == np.float32, scores.shape
    assert (items >= -1).all(), items
    padding = items == -1
    assert np.isfinite(scores[~padding]).all(), scores
    assert (scores[padding] == -np.inf).all(), scores


def run(package: str, signature_path: str) -> None:
    with open(signature_path) as f:
        contract = Contract.parse(f.read())
    counts = {"cases": 0, "accepted": 0, "refused": 0}
    first_request = None

    @SETTINGS
    @given(case(contract))
    def one(drawn):
        nonlocal first_request
        valid, inputs = drawn
        counts["cases"] += 1
        try:
            outputs = torch_call(package, inputs, OUT)
        except tf.errors.InvalidArgumentError:
            assert not valid, f"a valid request was refused: {[a.shape for a in inputs]}"
            counts["refused"] += 1
            return
        # Anything else (Internal, Unavailable, ...) raises here and fails the run.
        _check_answer(outputs, inputs[0].shape[0], contract)
        counts["accepted"] += 1
        if valid and first_request is None:
            first_request = ([a.copy() for a in inputs], outputs[0].numpy())

    one()
    assert first_request is not None, "no valid request was drawn"
    again = torch_call(package, first_request[0], OUT)[0].numpy()
    assert np.array_equal(again, first_request[1]), "the hostile cases changed a later answer"
    print(f"surface torch_call cases={counts['cases']} accepted={counts['accepted']} "
          f"refused={counts['refused']}", flush=True)
