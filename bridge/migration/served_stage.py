"""A Torch stage inside a served SavedModel: a ``TorchCall`` on the stage's own package.

:func:`served_replacement` gives the walk of :class:`bridge.migration.stages.StagedModel` a
replacement that flattens the stage call as its :class:`StageBoundary` says (tensors, then
Keras masks as bool tensors), checks every input against the package's contract and the
stage's id ranges, runs ``TorchCall`` and puts the masks back on the outputs.

The checks come first because compiled code trusts its inputs: a wrong size or an id past a
table would read out of bounds instead of raising. Each is a TF assertion, so a bad request is
refused with ``InvalidArgument`` naming the stage, the input and the rule (``stage pool: input
row_splits (the row splits of item_ids) must never decrease``: names unquoted, since TF escapes
quotes in an assertion's message), as TF's own layers refuse it. Before any stage runs,
:func:`model_input_checks` holds each model input to the rank and sizes the model declares.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import tensorflow as tf

from bridge.migration.keras_flavours import keras_mask, set_keras_mask
from bridge.migration.masks import tf_output_mask
from bridge.migration.stage_program import StageBoundary
from bridge.migration.stages import Replacement, StageError
from custom_ops.torch_call import torch_call

_UNBOUNDED = 2**62   # range ends at or past this are no bound worth checking


@dataclass(frozen=True)
class ServedStage:
    """What the served walk needs of one Torch stage (plain data; the package is an asset).

    ``inputs``: per flat input, its dtype and dims as the package contract gives them (an int,
    or a symbol shared by the inputs that must agree); ``ranges``: symbol -> (min, max);
    ``outputs``: per package output, dtype and static shape (None for open dims);
    ``id_bounds``: tensor input -> table rows; ``sources``: per tensor input, what it reads
    (a layer or model input), for messages."""

    boundary: StageBoundary
    inputs: tuple[tuple[str, tuple[int | str, ...]], ...]
    ranges: Mapping[str, tuple[int, int]]
    outputs: tuple[tuple[str, tuple[int | None, ...]], ...]
    id_bounds: Mapping[int, int] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    def describe(self, i: int) -> str:
        """Input ``i`` of the package in words: ``input 0 (fields)``, ``the Keras mask of
        input 1``."""
        b = self.boundary
        if i < b.tensors:
            source = self.sources[i] if i < len(self.sources) else "?"
            return f"input {i} ({source})"
        return f"the Keras mask of input {b.mask_inputs[i - b.tensors]}"


def input_checks(stage: ServedStage, flat: list[tf.Tensor]) -> list[tf.Operation]:
    """TF assertions of ``flat`` against the contract: dtype (at trace time), rank, fixed
    sizes, equal sizes, ranges and id bounds; each message names the stage and the input."""
    name = stage.boundary.name
    checks: list = []
    first: dict[str, tuple[int, int, tf.Tensor]] = {}
    for i, (x, (dtype, dims)) in enumerate(zip(flat, stage.inputs)):
        what = f"stage {name}: {stage.describe(i)}"
        if x.dtype.name != dtype:
            raise StageError(name, f"{stage.describe(i)} is {x.dtype.name}; the stage's "
                                   f"package takes {dtype}")
        checks.append(tf.debugging.assert_rank(x, len(dims), message=f"{what} must have rank "
                                                                      f"{len(dims)}"))
        shape = tf.shape(x, out_type=tf.int64)
        for d, size in enumerate(dims):
            if isinstance(size, int):
                checks.append(tf.debugging.assert_equal(
                    shape[d], tf.constant(size, tf.int64),
                    message=f"{what} must have size {size} in dimension {d}"))
                continue
            if size in first:
                j, e, other = first[size]
                checks.append(tf.debugging.assert_equal(
                    shape[d], other, message=f"{what} dimension {d} must equal "
                                             f"{stage.describe(j)} dimension {e}"))
                continue
            first[size] = (i, d, shape[d])
            lo, hi = stage.ranges.get(size, (0, _UNBOUNDED))
            if lo > 0:
                checks.append(tf.debugging.assert_greater_equal(
                    shape[d], tf.constant(lo, tf.int64),
                    message=f"{what} dimension {d} must be at least {lo}"))
            if hi < _UNBOUNDED:
                checks.append(tf.debugging.assert_less_equal(
                    shape[d], tf.constant(hi, tf.int64),
                    message=f"{what} dimension {d} must be at most {hi}"))
    for i, rows in sorted(stage.id_bounds.items()):
        x = flat[i]
        what = f"stage {name}: {stage.describe(i)} holds ids, which must lie in [0, {rows})"
        checks.append(tf.debugging.assert_non_negative(x, message=what))
        checks.append(tf.debugging.assert_less(x, tf.cast(rows, x.dtype), message=what))
    return checks


def served_replacement(stage: ServedStage, package: Any, layer: Any,
                       intra_op_threads: int = 1) -> Replacement:
    """The walk's replacement for ``stage``: ``package`` (an Asset or path) run by TorchCall."""
    b = stage.boundary
    dtypes = [tf.as_dtype(dtype) for dtype, _ in stage.outputs]
    shapes = [list(shape) for _, shape in stage.outputs]

    def call(args: tuple, kwargs: dict) -> list:
        tensors = [x for x in tf.nest.flatten((args, kwargs)) if tf.is_tensor(x)]
        if len(tensors) != b.tensors:
            raise StageError(b.name, f"the call has {len(tensors)} tensor inputs, the stage "
                                     f"was exported with {b.tensors}")
        masks = [keras_mask(tensors[i]) for i in b.mask_inputs]
        missing = [i for i, m in zip(b.mask_inputs, masks) if m is None]
        if missing:
            raise StageError(b.name, f"inputs {missing} carry no Keras mask, but the stage "
                                     "was exported with their masks")
        flat = tensors + [tf.cast(m, tf.bool) for m in masks]
        with tf.control_dependencies(input_checks(stage, flat)):
            flat = [tf.identity(x) for x in flat]
        results = torch_call(package, flat, dtypes, output_shapes=shapes,
                             intra_op_threads=intra_op_threads, name=_op_name(b.name))
        data = list(results[:b.outputs])
        for position, mask in zip(b.mask_outputs, results[b.outputs:]):
            set_keras_mask(data[position], mask)
        if b.tf_masks:
            mask = tf_output_mask(layer, args, kwargs)
            for value in data:
                set_keras_mask(value, mask)
        return data
    return call


def _op_name(stage: str) -> str:
    """A TF op name for the stage's TorchCall (letters, digits, ``_``)."""
    return "torch_" + "".join(c if c.isalnum() else "_" for c in stage)


_SHAPE_FUNCTIONS: dict[tf.DType, Any] = {}


def request_shape(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """``x``'s rank and shape (int64) as the request has them.

    A signature's inputs carry the shapes it declares, and TF's graph optimizer turns a rank
    or a size it believes known into a constant (also through a function's outputs: the
    shape vector's length), so a check of them would pass a request that breaks them. Both
    are taken in a function that is never inlined and whose argument declares no shape; the
    rank comes back as a value, which the optimizer does not see through."""
    function = _SHAPE_FUNCTIONS.get(x.dtype)
    if function is None:
        function = _SHAPE_FUNCTIONS[x.dtype] = tf.function(
            lambda value: (tf.cast(tf.rank(value), tf.int64),
                           tf.shape(value, out_type=tf.int64)),
            input_signature=[tf.TensorSpec(None, x.dtype)],
            experimental_attributes={"_noinline": True})
    return function(x)


def model_input_checks(name: str, value: tf.Tensor, spec: tf.TensorSpec,
                       reader: str) -> list[tf.Operation]:
    """TF assertions that model input ``name`` has the rank and the fixed sizes ``spec``
    declares (a signature takes any shape of its dtype); ``reader``: the first stage that
    reads it, named in the messages with the input (``stage features: input user must have
    size 3 in dimension 1 (the model declares shape (None, 3))``)."""
    if spec.shape.rank is None:
        return []
    dims = spec.shape.as_list()
    declared = "(" + ", ".join("None" if d is None else str(d) for d in dims) + \
        ("," if len(dims) == 1 else "") + ")"
    what = f"stage {reader}: input {name}"
    runtime_rank, shape = request_shape(value)
    rank = tf.debugging.assert_equal(
        runtime_rank, tf.constant(len(dims), tf.int64),
        message=f"{what} must have rank {len(dims)} (the model declares shape {declared})")
    checks = [rank]
    fixed = [(d, size) for d, size in enumerate(dims) if size is not None]
    if fixed:
        with tf.control_dependencies([rank]):
            # Padded, so a request of lower rank reads -1 here instead of past the shape.
            padded = tf.concat([shape, tf.fill([len(dims)], tf.constant(-1, tf.int64))], 0)
            for d, size in fixed:
                checks.append(tf.debugging.assert_equal(
                    padded[d], tf.constant(size, tf.int64),
                    message=f"{what} must have size {size} in dimension {d} (the model "
                            f"declares shape {declared})"))
    return checks


def ragged_input_checks(splits_name: str, splits: tf.Tensor, values: Mapping[str, tf.Tensor],
                        reader: str) -> list[tf.Operation]:
    """TF assertions that ``splits`` (int [B + 1]) partitions each of ``values`` [E, ...]:
    starts at 0, never decreases, ends at E. ``reader``: the stage that reads them, named in
    the messages (a Torch stage would index past the values on bad splits)."""
    what = f"stage {reader}: input {splits_name} (the row splits of {', '.join(values)})"
    splits = tf.cast(splits, tf.int64)
    checks = [tf.debugging.assert_rank(splits, 1, message=f"{what} must have rank 1"),
              tf.debugging.assert_greater_equal(tf.size(splits, tf.int64),
                                                tf.constant(1, tf.int64),
                                                message=f"{what} must hold at least one value")]
    with tf.control_dependencies(checks):
        checks.append(tf.debugging.assert_equal(splits[0], tf.constant(0, tf.int64),
                                                message=f"{what} must start at 0"))
        checks.append(tf.debugging.assert_non_negative(
            splits[1:] - splits[:-1], message=f"{what} must never decrease"))
        for name, value in values.items():
            checks.append(tf.debugging.assert_equal(
                splits[-1], tf.shape(value, out_type=tf.int64)[0],
                message=f"{what} must end at the length of input {name}"))
    return checks
