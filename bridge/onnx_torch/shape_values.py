"""Shape arithmetic on Python integers, so a converted graph exports through ``torch.export``.

tf2onnx computes shapes with tensors: ``Shape -> Gather / Slice -> Concat -> Reshape``. Run
as tensor ops, the target shape of the ``Reshape`` is a tensor whose values ``torch.export``
cannot see (a data-dependent size). The interpreter instead keeps such values as a
:class:`ShapeValue` (a list of ``int`` / ``SymInt``) while they come from shapes and small
integer constants only, and hands them to the converters that read shapes (``Reshape``'s
target, ``Expand``, ``Tile``, ``Range``, axes inputs, ...) as lists. Anywhere else a
ShapeValue becomes a tensor again.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

from bridge.onnx_torch.dtypes import torch_dtype
from bridge.onnx_torch.registry import GraphNode

STATIC_CONSTANT_LIMIT = 64   # integer constants up to this size are also kept as Python values


class ShapeValue(list):
    """A 0-d (``scalar``) or 1-d integer value known as Python ints / SymInts."""

    def __init__(self, values, scalar: bool = False, dtype: torch.dtype = torch.int64):
        super().__init__(values)
        self.scalar = scalar
        self.dtype = dtype

    def to_tensor(self) -> torch.Tensor:
        if self.scalar:
            return torch.as_tensor(self[0], dtype=self.dtype)
        return torch.stack([torch.as_tensor(v, dtype=self.dtype) for v in self]) if self \
            else torch.zeros(0, dtype=self.dtype)


# (op type, input position) pairs whose converter reads the input as a list of ints.
SHAPE_PARAMETERS = frozenset({
    ("Reshape", 1), ("Expand", 1), ("Tile", 1), ("ConstantOfShape", 0), ("Range", 0),
    ("Range", 1), ("Range", 2), ("Slice", 1), ("Slice", 2), ("Slice", 3), ("Slice", 4),
    ("Squeeze", 1), ("Unsqueeze", 1), ("ReduceSum", 1), ("ReduceMean", 1), ("ReduceMax", 1),
    ("TopK", 1), ("Pad", 1), ("Pad", 3), ("CumSum", 1)})


def as_shape_value(value: torch.Tensor) -> ShapeValue | None:
    """A constant of the graph (a real tensor, at build time) as a ShapeValue when it is a
    small integer scalar or vector; else None."""
    if not value.is_floating_point() and value.dtype != torch.bool and value.dim() <= 1 and \
            value.numel() <= STATIC_CONSTANT_LIMIT:
        return ShapeValue(value.reshape(-1).tolist(), value.dim() == 0, value.dtype)
    return None


def _binary(fn: Callable[[Any, Any], Any]):
    def run(node, a: ShapeValue, b: ShapeValue) -> ShapeValue:
        if len(a) != len(b) and 1 not in (len(a), len(b)):
            raise ValueError("shapes do not broadcast")
        n = max(len(a), len(b))
        left, right = (a * n if len(a) == 1 else a), (b * n if len(b) == 1 else b)
        return ShapeValue([fn(x, y) for x, y in zip(left, right)], a.scalar and b.scalar,
                          a.dtype)
    return run


def _shape(node: GraphNode, x: torch.Tensor) -> ShapeValue:
    start, end = node.attr("start", 0), node.attr("end")
    return ShapeValue(list(x.shape)[start:end])


def _gather(node: GraphNode, data: ShapeValue, indices: ShapeValue) -> ShapeValue:
    picked = [data[int(i)] for i in indices]
    return ShapeValue(picked, indices.scalar, data.dtype)


def _slice(node: GraphNode, data: ShapeValue, starts: ShapeValue, ends: ShapeValue,
           axes: ShapeValue | None = None, steps: ShapeValue | None = None) -> ShapeValue:
    step = int(steps[0]) if steps else 1
    return ShapeValue(data[int(starts[0]):int(ends[0]):step], False, data.dtype)


def _cast(node: GraphNode, x: ShapeValue) -> ShapeValue:
    dtype = torch_dtype(node.attr("to"), f"Cast node {node.name!r}")
    if dtype.is_floating_point or dtype == torch.bool:
        raise ValueError("not an integer cast")
    return ShapeValue(list(x), x.scalar, dtype)


def _concat(node: GraphNode, *parts: ShapeValue) -> ShapeValue:
    return ShapeValue([v for p in parts if p is not None for v in p], False, parts[0].dtype)


def _unsqueeze(node: GraphNode, x: ShapeValue, axes: ShapeValue | None = None) -> ShapeValue:
    if not x.scalar:
        raise ValueError("only scalars become 1-d")
    return ShapeValue(list(x), False, x.dtype)


def _squeeze(node: GraphNode, x: ShapeValue, axes: ShapeValue | None = None) -> ShapeValue:
    if len(x) != 1 or x.scalar:
        raise ValueError("only one-element 1-d values become scalars")
    return ShapeValue(list(x), True, x.dtype)


def _reduce_prod(node: GraphNode, x: ShapeValue, axes: ShapeValue | None = None) -> ShapeValue:
    return ShapeValue([math.prod(x)], not node.attr("keepdims", 1), x.dtype)


EVALUATORS: dict[str, Callable] = {
    "Shape": _shape, "Gather": _gather, "Slice": _slice, "Cast": _cast, "Concat": _concat,
    "Unsqueeze": _unsqueeze, "Squeeze": _squeeze, "ReduceProd": _reduce_prod,
    "Identity": lambda node, x: x,
    "Add": _binary(lambda a, b: a + b), "Sub": _binary(lambda a, b: a - b),
    "Mul": _binary(lambda a, b: a * b), "Div": _binary(lambda a, b: a // b),
    "Max": _binary(max), "Min": _binary(min),
}


def evaluate(node: GraphNode, inputs: list) -> ShapeValue | None:
    """The node's output as a ShapeValue when it is shape arithmetic on shape values and
    small integer constants (``Shape`` on any tensor); None when it is not."""
    if node.op_type not in EVALUATORS or len(node.outputs) != 1:
        return None
    if node.op_type == "Shape":
        return _shape(node, inputs[0])
    # Constants reach here as ShapeValues already (the module keeps its small integer ones
    # so); a runtime tensor is never read as Python values (under torch.export its size or
    # values may be symbolic).
    present = [x for x in inputs if x is not None]
    if not present or not all(isinstance(x, ShapeValue) for x in present):
        return None
    try:
        return EVALUATORS[node.op_type](node, *inputs)
    except (ValueError, IndexError, TypeError):
        return None


def converter_input(node: GraphNode, position: int, value: Any) -> Any:
    """What a converter receives for ``value``: a ShapeValue where it reads a shape, a tensor
    anywhere else."""
    if isinstance(value, ShapeValue) and (node.op_type, position) not in SHAPE_PARAMETERS:
        return value.to_tensor()
    return value
