"""Converters for the ONNX ops of segment sums, ragged pooling and sparse lookups: ranges,
cumulative sums, tiling, padding, scatters, and the ops whose output size depends on the
data (``Unique``, ``NonZero``, ``Compress``, and ``TopK`` with a runtime ``k``).

tf2onnx emits them for ``tf.math.segment_sum`` / ``unsorted_segment_sum`` (ScatterND with
reduction add), ``tf.RaggedTensor`` row arithmetic (Range, CumSum, Tile, Compress),
``tf.nn.embedding_lookup_sparse`` (Unique, Gather, segment sums) and masked pooling.
"""

from __future__ import annotations

import math

import torch

from bridge.onnx_torch.registry import GraphNode, converter
from xgr_common.errors import ConversionError


def _ints(values) -> list[int]:
    """A shape-like input as ints: a tensor, or the interpreter's list of shape values."""
    return [v if isinstance(v, torch.SymInt) else int(v)
            for v in (values if isinstance(values, list) else values.reshape(-1).tolist())]


def _scalar(value):
    """A 0-d input as a Python number."""
    return value[0] if isinstance(value, list) else value.item()


@converter("Tile", since_version=6)
def tile(node: GraphNode, x: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
    """Tensor.repeat(repeats): one repeat count per axis."""
    return x.repeat(*_ints(repeats))


@converter("ConstantOfShape", since_version=9)
def constant_of_shape(node: GraphNode, shape: torch.Tensor) -> torch.Tensor:
    """torch.full(shape) with the one-element ``value`` attribute (default float32 0)."""
    value = node.attr("value")
    if value is None:
        return torch.zeros(_ints(shape), dtype=torch.float32)
    return torch.full(_ints(shape), value.reshape(-1)[0].item(), dtype=value.dtype)


@converter("Range", since_version=11)
def range_(node: GraphNode, start: torch.Tensor, limit: torch.Tensor,
           delta: torch.Tensor) -> torch.Tensor:
    """start + delta * [0, n), n = max(ceil((limit - start) / delta), 0), as ONNX defines it
    (torch.arange refuses a limit on the wrong side, ONNX gives an empty range)."""
    first, last, step = _scalar(start), _scalar(limit), _scalar(delta)
    count = max(math.ceil((last - first) / step), 0)
    return first + step * torch.arange(count, dtype=start.dtype)


@converter("CumSum", since_version=11)
def cumsum(node: GraphNode, x: torch.Tensor, axis: torch.Tensor) -> torch.Tensor:
    """torch.cumsum along ``axis``; ``exclusive`` shifts by one, ``reverse`` sums from the end."""
    dim = int(_scalar(axis)) % x.dim()
    if node.attr("reverse", 0):
        x = x.flip(dim)
    out = torch.cumsum(x, dim, dtype=x.dtype)
    if node.attr("exclusive", 0):
        out = out - x
    return out.flip(dim) if node.attr("reverse", 0) else out


_REDUCE = {"mul": "prod", "max": "amax", "min": "amin"}


def _scatter_rows(out2: torch.Tensor, rows: torch.Tensor, updates2: torch.Tensor,
                  reduction: str) -> torch.Tensor:
    """Rows ``rows`` of the 2-D ``out2`` combined with ``updates2`` by ``reduction``."""
    if reduction == "none":
        return out2.index_copy(0, rows, updates2)
    if reduction == "add":
        return out2.index_add(0, rows, updates2)
    if reduction in _REDUCE:
        index = rows[:, None].expand_as(updates2)
        return out2.scatter_reduce(0, index, updates2, _REDUCE[reduction], include_self=True)
    raise ConversionError(f"scatter reduction {reduction!r} is not one of none, add, mul, "
                          "max, min")


@converter("ScatterND", since_version=11)
def scatter_nd(node: GraphNode, data: torch.Tensor, indices: torch.Tensor,
               updates: torch.Tensor) -> torch.Tensor:
    """``data`` with the slices at ``indices[..., :k]`` set to (or, with ``reduction``,
    combined with) ``updates``; the segment sums of TF (reduction add)."""
    k = indices.shape[-1]
    idx = indices.long().reshape(-1, k)
    sizes = torch.tensor(data.shape[:k], dtype=torch.long)
    idx = torch.where(idx < 0, idx + sizes, idx)
    strides = torch.ones(k, dtype=torch.long)
    for j in range(k - 2, -1, -1):
        strides[j] = strides[j + 1] * data.shape[j + 1]
    rows = (idx * strides).sum(-1)
    tail = data.shape[k:]
    out2 = data.reshape(-1, int(torch.tensor(tail).prod()) if tail else 1)
    updates2 = updates.reshape(rows.shape[0], out2.shape[1]).to(data.dtype)
    return _scatter_rows(out2, rows, updates2, node.attr("reduction", "none")).reshape(data.shape)


@converter("ScatterElements", since_version=11)
def scatter_elements(node: GraphNode, data: torch.Tensor, indices: torch.Tensor,
                     updates: torch.Tensor) -> torch.Tensor:
    """torch.scatter / scatter_reduce along ``axis``; negative indices count from the end."""
    axis = node.attr("axis", 0) % data.dim()
    idx = indices.long()
    idx = torch.where(idx < 0, idx + data.shape[axis], idx)
    reduction = node.attr("reduction", "none")
    if reduction == "none":
        return data.scatter(axis, idx, updates)
    if reduction == "add":
        return data.scatter_add(axis, idx, updates)
    if reduction in _REDUCE:
        return data.scatter_reduce(axis, idx, updates, _REDUCE[reduction], include_self=True)
    raise ConversionError(f"node {node.name!r}: ScatterElements reduction {reduction!r}")


def _pad_positions(size: int, begin: int, end: int, mode: str) -> torch.Tensor:
    """Source positions of an axis padded by (begin, end) in ``mode`` (negative pads crop)."""
    i = torch.arange(-begin, size + end)
    if mode == "edge":
        return i.clamp(0, size - 1)
    if mode == "wrap":
        return torch.remainder(i, size)
    period = max(2 * (size - 1), 1)            # reflect: ... 2 1 | 0 1 2 3 | 2 1 ...
    i = torch.remainder(i, period)
    return torch.where(i >= size, period - i, i)


@converter("Pad", since_version=11)
def pad(node: GraphNode, x: torch.Tensor, pads: torch.Tensor,
        value: torch.Tensor | None = None, axes: torch.Tensor | None = None) -> torch.Tensor:
    """Pad (or, with negative pads, crop) each axis; ``pads`` lists all begins then all ends.
    ``constant`` fills with ``value`` (default 0); ``edge`` / ``reflect`` / ``wrap`` gather
    the border, mirrored or wrapped positions."""
    rank = x.dim()
    axes_list = [a % rank for a in _ints(axes)] if axes is not None else list(range(rank))
    amounts = _ints(pads)
    per_axis = dict(zip(axes_list, zip(amounts[:len(axes_list)], amounts[len(axes_list):])))
    mode = node.attr("mode", "constant")
    if mode == "constant":
        flat: list[int] = []
        for axis in reversed(range(rank)):
            flat.extend(per_axis.get(axis, (0, 0)))
        fill = 0 if value is None or value.numel() == 0 else value.reshape(-1)[0].item()
        return torch.nn.functional.pad(x, flat, mode="constant", value=fill)
    if mode not in ("edge", "reflect", "wrap"):
        raise ConversionError(f"node {node.name!r}: Pad mode {mode!r}")
    for axis, (begin, end) in per_axis.items():
        x = torch.index_select(x, axis, _pad_positions(x.shape[axis], begin, end, mode))
    return x


@converter("Mod", since_version=10)
def mod(node: GraphNode, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``fmod=0``: the remainder takes the divisor's sign (integers); ``fmod=1``: C fmod."""
    return torch.fmod(a, b) if node.attr("fmod", 0) else torch.remainder(a, b)


@converter("TopK", since_version=11)
def top_k(node: GraphNode, x: torch.Tensor, k: torch.Tensor):
    """torch.topk along ``axis``: (values, int64 indices), largest first unless
    ``largest=0``."""
    values, indices = torch.topk(x, _ints(k)[0], dim=node.attr("axis", -1),
                                 largest=bool(node.attr("largest", 1)), sorted=True)
    return values, indices


@converter("NonZero", since_version=9)
def non_zero(node: GraphNode, x: torch.Tensor) -> torch.Tensor:
    """Indices of the non-zero elements, int64 [rank, count] (row-major order)."""
    return torch.nonzero(x).T.contiguous()


@converter("Compress", since_version=11)
def compress(node: GraphNode, x: torch.Tensor, condition: torch.Tensor) -> torch.Tensor:
    """The slices along ``axis`` (or the flat elements) where ``condition`` is true; a short
    condition selects nothing past its end."""
    axis = node.attr("axis")
    data = x.reshape(-1) if axis is None else x
    dim = 0 if axis is None else axis % x.dim()
    picked = torch.nonzero(condition.reshape(-1)).reshape(-1)
    picked = picked[picked < data.shape[dim]]
    return torch.index_select(data, dim, picked)


@converter("Unique", since_version=11)
def unique(node: GraphNode, x: torch.Tensor):
    """(unique values, first-occurrence indices, inverse indices, counts), int64 indices.
    ``sorted=0`` keeps the order of first occurrence (``tf.unique``'s order)."""
    axis = node.attr("axis")
    data = x.reshape(-1) if axis is None else x
    dim = 0 if axis is None else axis % x.dim()
    values, inverse, counts = torch.unique(data, sorted=True, return_inverse=True,
                                           return_counts=True, dim=dim)
    positions = torch.arange(data.shape[dim])
    first = torch.full((values.shape[dim],), data.shape[dim], dtype=torch.long).scatter_reduce(
        0, inverse, positions, "amin", include_self=True)
    if not node.attr("sorted", 1):
        order = torch.argsort(first)
        values = torch.index_select(values, dim, order)
        first, counts = first[order], counts[order]
        inverse = torch.argsort(order)[inverse]
    return values, first, inverse, counts


@converter("GatherND", since_version=12)
def gather_nd(node: GraphNode, data: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The slices of ``data`` at ``indices[..., :k]``; the first ``batch_dims`` axes of both
    index each other (``tf.gather_nd``; sparse lookups gather this way)."""
    batch_dims = node.attr("batch_dims", 0)
    idx = indices.long()
    if batch_dims:
        # Prepend each element's batch position, then gather as if batch_dims were 0.
        grids = torch.meshgrid(*[torch.arange(n) for n in idx.shape[:-1]], indexing="ij")
        idx = torch.cat([torch.stack(grids[:batch_dims], -1), idx], -1)
    k = idx.shape[-1]
    sizes = torch.tensor(data.shape[:k], dtype=torch.long)
    flat = idx.reshape(-1, k)
    flat = torch.where(flat < 0, flat + sizes, flat)
    picked = data[tuple(flat.T)]
    return picked.reshape(*indices.shape[:-1], *data.shape[k:])
