"""Converters for ONNX shape, indexing and type ops (ai.onnx domain).

Axes moved from attributes to inputs in opset 13 (Squeeze, Unsqueeze, ReduceSum) and 18
(ReduceMean, ReduceMax): each form is its own registered version.
"""

from __future__ import annotations

import torch

from bridge.onnx_torch.dtypes import torch_dtype
from bridge.onnx_torch.registry import GraphNode, converter


def _axes(values) -> list[int]:
    """A shape-like input as ints; symbolic sizes (``torch.export``) stay symbolic, since
    ``int()`` would fix them to the example's value."""
    return [a if isinstance(a, torch.SymInt) else int(a)
            for a in (values.tolist() if isinstance(values, torch.Tensor) else values)]


@converter("Identity")
def identity(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
    """Returns the input tensor itself."""
    return x


@converter("Constant", since_version=9)
def constant(node: GraphNode) -> torch.Tensor:
    """The node's ``value`` tensor (folded once when the module is built)."""
    return node.attr("value")


@converter("Cast", since_version=6)
def cast(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
    """Tensor.to(dtype); float -> int truncates toward zero like ONNX."""
    return x.to(torch_dtype(node.attr("to"), f"Cast node {node.name!r}"))


@converter("Shape", since_version=1)
def shape(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
    """The input's shape as int64 [rank]."""
    return torch.tensor(x.shape, dtype=torch.int64)


@converter("Reshape", since_version=5)
def reshape(node: GraphNode, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """torch.reshape; a 0 in the target copies the input's dimension (allowzero=0)."""
    dims = [x.shape[i] if d == 0 and not node.attr("allowzero", 0) else d
            for i, d in enumerate(_axes(target))]
    return torch.reshape(x, dims)


@converter("Flatten", since_version=1)
def flatten(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
    """2-D [prod(shape[:axis]), prod(shape[axis:])]."""
    axis = node.attr("axis", 1) % (x.dim() + 1)
    return x.reshape(int(torch.tensor(x.shape[:axis]).prod()), -1)


@converter("Transpose", since_version=1)
def transpose(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
    """Tensor.permute(perm); no perm reverses the axes."""
    perm = node.attr("perm") or list(reversed(range(x.dim())))
    return x.permute(*perm)


@converter("Concat", since_version=4)
def concat(node: GraphNode, *xs: torch.Tensor) -> torch.Tensor:
    """torch.cat along ``axis``."""
    return torch.cat([x for x in xs if x is not None], dim=node.attr("axis"))


@converter("Gather", since_version=1)
def gather(node: GraphNode, data: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Numpy-style take along ``axis``; negative indices count from the end."""
    axis = node.attr("axis", 0) % data.dim()
    idx = indices.long()
    idx = torch.where(idx < 0, idx + data.shape[axis], idx)
    out = torch.index_select(data, axis, idx.reshape(-1))
    return out.reshape(*data.shape[:axis], *indices.shape, *data.shape[axis + 1:])


@converter("Slice", since_version=10)
def slice_(node: GraphNode, x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
           axes: torch.Tensor | None = None, steps: torch.Tensor | None = None) -> torch.Tensor:
    """Basic slicing; ends beyond the dimension clamp as in numpy (positive steps only)."""
    axes_list = _axes(axes) if axes is not None else list(range(len(starts)))
    steps_list = _axes(steps) if steps is not None else [1] * len(axes_list)
    index = [slice(None)] * x.dim()
    for axis, start, end, step in zip(axes_list, _axes(starts), _axes(ends), steps_list):
        size = x.shape[axis]
        index[axis] = slice(max(min(start, size), -size), max(min(end, size), -size - 1), step)
    return x[tuple(index)]


@converter("Expand", since_version=8)
def expand(node: GraphNode, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Bidirectional broadcast of ``x`` to ``target``."""
    return x.expand(torch.broadcast_shapes(x.shape, tuple(_axes(target))))


@converter("Squeeze", since_version=1)
def squeeze_attr(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
    """Drop the ``axes`` attribute's size-1 axes (all of them when absent)."""
    axes = node.attr("axes")
    return x.squeeze() if axes is None else x.squeeze(tuple(axes))


@converter("Squeeze", since_version=13)
def squeeze(node: GraphNode, x: torch.Tensor, axes: torch.Tensor | None = None) -> torch.Tensor:
    """Drop the size-1 axes named by the ``axes`` input (all of them when absent)."""
    return x.squeeze() if axes is None else x.squeeze(tuple(_axes(axes)))


def _unsqueeze(x: torch.Tensor, axes: list[int]) -> torch.Tensor:
    rank = x.dim() + len(axes)
    for axis in sorted(a % rank for a in axes):
        x = x.unsqueeze(axis)
    return x


@converter("Unsqueeze", since_version=1)
def unsqueeze_attr(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
    """Insert size-1 axes at the ``axes`` attribute (positions in the output)."""
    return _unsqueeze(x, list(node.attr("axes")))


@converter("Unsqueeze", since_version=13)
def unsqueeze(node: GraphNode, x: torch.Tensor, axes: torch.Tensor) -> torch.Tensor:
    """Insert size-1 axes at the ``axes`` input (positions in the output)."""
    return _unsqueeze(x, _axes(axes))


def _reduce(fn, x: torch.Tensor, axes, keepdims: int, noop_with_empty_axes: int = 0):
    if axes is None or len(axes) == 0:
        if noop_with_empty_axes:
            return x
        axes = list(range(x.dim()))
    # ONNX keeps the input dtype (torch.sum would widen int32 to int64).
    return fn(x, dim=tuple(a % x.dim() for a in axes), keepdim=bool(keepdims)).to(x.dtype)


def _amax(x, dim, keepdim):
    return torch.amax(x, dim=dim, keepdim=keepdim)


for _name, _fn, _new in (("ReduceMean", torch.mean, 18), ("ReduceSum", torch.sum, 13),
                         ("ReduceMax", _amax, 18)):
    converter(_name, since_version=1, summary=f"{_fn.__name__} over the axes attribute")(
        lambda node, x, _f=_fn: _reduce(_f, x, node.attr("axes"), node.attr("keepdims", 1)))
    converter(_name, since_version=_new, summary=f"{_fn.__name__} over the axes input")(
        lambda node, x, axes=None, _f=_fn: _reduce(
            _f, x, None if axes is None else _axes(axes), node.attr("keepdims", 1),
            node.attr("noop_with_empty_axes", 0)))
