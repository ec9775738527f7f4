"""One Torch stage of a plan as a program of plain tensors, exported with ``torch.export``.

A served stage crosses the SavedModel's ``TorchCall`` op, which carries dense tensors only.
:class:`StageBoundary` says how a stage's call flattens: its tensor inputs in call order, then
one bool tensor per Keras mask it reads (``mask_inputs``: positions among the tensors), and
its outputs, then one bool tensor per output mask it gives (``mask_outputs``). The masks
follow the runner's rules (:mod:`bridge.migration.masks`): a converted stage takes the masks
it was traced with; a hand-written module takes them as ``forward(..., mask=...)`` and returns
one with ``returns_mask``; any other output mask is TF's ``compute_mask`` (``tf_masks``),
computed on the TF side of the boundary.

:class:`StageProgram` wraps the stage's module so its ``forward`` takes and returns that flat
list; :func:`export_stage` exports it with the dimensions the Keras model leaves open kept
dynamic, from size 1 up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from bridge.migration.keras_flavours import keras_mask
from bridge.migration.masks import takes_mask
from bridge.onnx_torch.module import OnnxGraphModule
from xgr_common.errors import ExportError, MigrationError


@dataclass(frozen=True)
class StageBoundary:
    """How one stage call flattens into TorchCall's inputs and outputs."""

    name: str
    tensors: int                      # tensor inputs, in call order
    mask_inputs: tuple[int, ...]      # tensor positions whose Keras mask follows them
    outputs: int                      # data outputs
    mask_outputs: tuple[int, ...]     # output positions whose mask the package returns
    tf_masks: bool                    # outputs take the TF layer's compute_mask instead
    mask_kwarg: bool = False          # a hand-written module given forward(..., mask=...)

    @property
    def flat_inputs(self) -> int:
        return self.tensors + len(self.mask_inputs)


def describe_boundary(name: str, module: nn.Module, layer: Any, tensors: Sequence[Any],
                      outputs: int) -> StageBoundary:
    """The boundary of stage ``name`` called on ``tensors`` (its TF input tensors, masks
    attached as Keras attaches them). Refuses, as the runner does, a stage whose masks the
    module cannot take."""
    carried = tuple(i for i, x in enumerate(tensors) if keras_mask(x) is not None)
    layer_reads = takes_mask(getattr(layer, "call", None))
    if isinstance(module, OnnxGraphModule):
        spec = module.spec
        missing = [i for i in spec.mask_inputs if i not in carried]
        unused = [i for i in carried if i not in spec.mask_inputs]
        if missing:
            raise MigrationError(f"stage {name!r}: inputs {missing} carry no Keras mask, but "
                                 "the stage was converted with their masks")
        if unused and layer_reads:
            raise MigrationError(f"stage {name!r}: inputs {unused} carry Keras masks the "
                                 "converted stage does not take; reconvert it with "
                                 "`xgr migrate auto`")
        return StageBoundary(name, len(tensors), tuple(spec.mask_inputs), outputs,
                             tuple(spec.mask_outputs), tf_masks=False)
    takes = takes_mask(module.forward)
    if carried and layer_reads and not takes:
        raise MigrationError(f"stage {name!r}: inputs {list(carried)} carry Keras masks that "
                             f"the TF layer reads, but {type(module).__name__}.forward takes "
                             "no `mask` argument: moving it would lose the mask")
    returns = bool(getattr(module, "returns_mask", False))
    return StageBoundary(name, len(tensors), carried if takes else (), outputs,
                         (0,) if returns else (), tf_masks=not returns,
                         mask_kwarg=bool(carried) and takes)


class StageProgram(nn.Module):
    """``forward(*flat)``: the stage's tensors then its masks (``boundary``) -> its outputs
    then its output masks, as one flat tuple."""

    def __init__(self, module: nn.Module, boundary: StageBoundary):
        super().__init__()
        self.stage = module
        self.boundary = boundary

    def forward(self, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = self.boundary
        tensors, masks = list(flat[:b.tensors]), list(flat[b.tensors:])
        if isinstance(self.stage, OnnxGraphModule):
            result = self.stage(*tensors, *masks)
        elif b.mask_kwarg:
            crossed: list[torch.Tensor | None] = [None] * b.tensors
            for position, mask in zip(b.mask_inputs, masks):
                crossed[position] = mask
            result = self.stage(*tensors, mask=crossed[0] if b.tensors == 1 else tuple(crossed))
        else:
            result = self.stage(*tensors)
        results = tuple(result) if isinstance(result, (tuple, list)) else (result,)
        expected = b.outputs + len(b.mask_outputs)
        if len(results) != expected:
            raise MigrationError(f"stage {b.name!r}: the module returned {len(results)} "
                                 f"tensors, the boundary has {b.outputs} outputs and "
                                 f"{len(b.mask_outputs)} masks")
        return results


def flat_example(boundary: StageBoundary, tensors: Sequence[Any]) -> list[torch.Tensor]:
    """A stage call's TF tensors (masks attached) as the program's flat torch inputs."""
    values = list(tensors) + [keras_mask(tensors[i]) for i in boundary.mask_inputs]
    return [torch.from_numpy(v.numpy().copy()) for v in values]


def open_dims(tensors: Sequence[Any], symbolic: Sequence[Any],
              boundary: StageBoundary) -> list[tuple[int, ...]]:
    """Per flat input, the dimensions the Keras graph leaves open (``None``); a mask's are
    those of its symbolic mask, or else its tensor's leading ones."""
    def dims(ref: Any) -> tuple[int, ...]:
        return tuple(d for d, size in enumerate(getattr(ref, "shape", ())) if size is None)

    result = [dims(ref) for ref in symbolic]
    for i in boundary.mask_inputs:
        rank = len(keras_mask(tensors[i]).shape)
        mask = keras_mask(symbolic[i])
        result.append(dims(mask) if mask is not None else
                      tuple(d for d in dims(symbolic[i]) if d < rank))
    return result


def _symbol_groups(program: Any) -> dict[str, list[tuple[int, int]]]:
    """Plain symbols of an exported program's inputs -> the (input, dim) pairs that hold
    them; None when a dimension is an expression (``s0 + 1``)."""
    groups: dict[str, list[tuple[int, int]]] = {}
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    for i, name in enumerate(program.graph_signature.user_inputs):
        for d, size in enumerate(placeholders[name].meta["val"].shape):
            if isinstance(size, torch.SymInt):
                text = str(size)
                if not text.isidentifier():
                    return {}
                groups.setdefault(text, []).append((i, d))
    return groups


def export_stage(program: StageProgram, example: Sequence[torch.Tensor],
                 dims: Sequence[tuple[int, ...]], device: str = "cpu"):
    """``torch.export`` of a stage program, its ``dims`` (per input) dynamic.

    A first export with ``Dim.AUTO`` finds which open dimensions are equal (a batch shared by
    all inputs); a second gives each such group a named dimension from 1 up, so one-row
    requests run. (``Dim.AUTO`` starts its ranges at 2, and torch guards sizes derived from
    them, ``rows = len(row_splits) - 1``, the same way: the second export is traced
    oblivious of sizes 0 and 1.) Where the second export fails (the stage's code specialises
    a size), the first is kept and its ranges say so. Refusals name the stage and give
    torch's reason."""
    import torch.fx.experimental._config as fx_config
    from torch.export import Dim

    from xgr_common.import_order import check_triton_importable

    check_triton_importable()   # torch.export may import triton: it must come before TF
    name = program.boundary.name
    module = program.to(device).eval()
    args = tuple(t.to(device) for t in example)

    def run(shapes, oblivious=False):
        with torch.no_grad(), fx_config.patch(backed_size_oblivious=oblivious):
            return torch.export.export(module, args, dynamic_shapes=(shapes,), strict=False)

    auto = tuple({d: Dim.AUTO for d in ds} if t.dim() else None for t, ds in zip(args, dims))
    try:
        first = run(auto)
    except Exception as error:  # torch.export raises many unrelated classes
        raise ExportError(f"stage {name!r} cannot be exported with torch.export "
                          f"({type(program.stage).__name__}): {_reason(error)}") from error
    groups = _symbol_groups(first)
    if not groups:
        return first
    named: list[dict | None] = [None if not t.dim() else {} for t in args]
    for k, (symbol, places) in enumerate(sorted(groups.items())):
        dim = Dim(f"d{k}", min=1)
        for i, d in places:
            named[i][d] = dim
    try:
        return run(tuple(named), oblivious=True)
    except Exception:  # the stage specialises a size torch.export then names in its error
        return first


def _reason(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


# Ops whose output does not depend on the values of their inputs, only on their sizes.
_SIZE_ONLY = ("Shape", "Size", "ConstantOfShape")


def _graph_inputs_reaching(value: str, producer: dict, inputs: dict) -> set[int]:
    """The graph inputs whose values ``value`` is computed from (constants and sizes add
    none)."""
    found, stack, seen = set(), [value], set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.add(inputs[name])
        elif name in producer and producer[name].op_type not in _SIZE_ONLY:
            stack.extend(i for i in producer[name].inputs if i)
    return found


def id_bounds(module: nn.Module, layer: Any) -> dict[int, int]:
    """Tensor input -> n, for inputs that index a table of n rows (ids must lie in [0, n)).

    TF's gather refuses an id outside its table; compiled Torch code trusts its indices, so
    the served model checks them before the package runs. Found for converted stages (an
    ONNX ``Gather`` on axis 0 of a constant whose indices are computed from one graph input:
    Keras 3 wraps negative ids first, which the check, stricter, refuses), for hand-written
    twins of a Keras ``Embedding`` (its ``input_dim``), and for a hand-written module that
    declares them (``id_bounds = {input: rows}``)."""
    if isinstance(module, OnnxGraphModule):
        spec = module.spec
        inputs = {v.name: i for i, v in enumerate(spec.inputs)}
        producer = {out: node for node in spec.nodes for out in node.outputs}
        found: dict[int, int] = {}
        for node in spec.nodes:
            if node.op_type != "Gather" or node.attr("axis", 0) != 0:
                continue
            table = module._slots.get(node.inputs[0])
            reached = _graph_inputs_reaching(node.inputs[1], producer, inputs)
            integer = [i for i in reached if "int" in spec.inputs[i].dtype]
            if table is not None and len(reached) == 1 and integer:
                (index,) = reached
                rows = int(getattr(module, table).shape[0])
                found[index] = min(rows, found.get(index, rows))
        return found
    declared = getattr(module, "id_bounds", None)
    if isinstance(declared, dict):
        return {int(i): int(rows) for i, rows in declared.items()}
    rows = getattr(layer, "input_dim", None)
    if type(layer).__name__ == "Embedding" and isinstance(rows, int):
        return {0: rows}
    return {}
