"""The way out: a plan whose every stage runs in Torch, assembled into one ``nn.Module``.

``assemble(plan, plan_dir)`` reads the Functional model's graph once (TF is needed for that
step only) and returns an :class:`AssembledModel`: the plan's stage modules, with their
weights, wired as the Keras graph wires the layers. It runs without TensorFlow, its
``state_dict`` holds every weight, and it exports through ``torch.export``
(:func:`export_assembled`).

Keras masks travel between stages as they do in the runner (:mod:`bridge.migration.masks`),
except that no TF ``compute_mask`` is there to fill in a mask a hand-written module does not
return: such a stage is refused at assembly, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from bridge.migration.keras_flavours import keras_mask
from bridge.migration.masks import takes_mask
from bridge.migration.plan import MigrationPlan
from bridge.migration.runner import PlanRunner
from bridge.onnx_torch.module import OnnxGraphModule
from xgr_common.errors import ExportError, MigrationError

# ONNX ops whose output size depends on the values of their input.
DATA_DEPENDENT_OPS = frozenset({"Unique", "NonZero", "Compress"})

Source = tuple[int, int]   # (producer, output index); producer -1 is the model's inputs
# Where a mask comes from: ("value", producer, index) when the mask is itself a tensor of the
# graph (Keras 3 computes some masks with op nodes), ("mask", producer, index) when it is the
# mask a stage gave its output.
MaskSource = tuple[str, int, int]


@dataclass(frozen=True)
class StageWiring:
    """Where one stage's tensor inputs (and their masks) come from, and what it yields."""

    name: str
    slot: str                          # the stage module's name inside AssembledModel
    inputs: tuple[Source, ...]
    mask_inputs: tuple[MaskSource | None, ...]   # per input: where its mask comes from
    outputs: int
    output_masks: tuple[bool, ...]     # per output: whether the stage yields a mask for it


def _slot(name: str) -> str:
    return "stage_" + "".join(c if c.isalnum() else "_" for c in name)


class AssembledModel(nn.Module):
    """All stages of a migrated Functional model in one module.

    ``forward(*inputs)`` takes the model inputs in ``input_names`` order (torch tensors of the
    model's dtypes) and returns the outputs in ``output_names`` order (one tensor or a tuple).
    """

    def __init__(self, stages: nn.ModuleDict, wiring: Sequence[StageWiring],
                 input_names: Sequence[str], outputs: Sequence[Source],
                 output_names: Sequence[str], open_dims: Sequence[tuple[int, ...]] = ()):
        super().__init__()
        self.stages = stages
        self.wiring = tuple(wiring)
        self.input_names = tuple(input_names)
        self.output_sources = tuple(outputs)
        self.output_names = tuple(output_names)
        # Per input, the dimensions the Keras model leaves open (batch, sequence length).
        self.open_dims = tuple(open_dims) or tuple((0,) for _ in input_names)

    def forward(self, *inputs: torch.Tensor):
        if len(inputs) != len(self.input_names):
            raise MigrationError(f"the assembled model takes {len(self.input_names)} inputs "
                                 f"{list(self.input_names)}, got {len(inputs)}")
        values: dict[Source, torch.Tensor] = {(-1, i): x for i, x in enumerate(inputs)}
        masks: dict[Source, torch.Tensor] = {}
        for index, stage in enumerate(self.wiring):
            module = self.stages[stage.slot]
            args = [values[s] for s in stage.inputs]
            stage_masks = [None if s is None else (values if s[0] == "value" else masks)[s[1:]]
                           for s in stage.mask_inputs]
            kwargs: dict = {}
            if isinstance(module, OnnxGraphModule):
                args += [stage_masks[i] for i in module.spec.mask_inputs]
            elif any(m is not None for m in stage_masks):
                kwargs["mask"] = stage_masks[0] if len(stage_masks) == 1 else tuple(stage_masks)
            result = module(*args, **kwargs)
            results = list(result) if isinstance(result, (tuple, list)) else [result]
            if isinstance(module, OnnxGraphModule):
                data = results[:stage.outputs]
                for position, mask in zip(module.spec.mask_outputs, results[stage.outputs:]):
                    masks[(index, position)] = mask
            elif getattr(module, "returns_mask", False):
                data = results[:1]
                masks[(index, 0)] = results[1]
            else:
                data = results
            for position, value in enumerate(data):
                values[(index, position)] = value
        outs = tuple(values[s] for s in self.output_sources)
        return outs[0] if len(outs) == 1 else outs

    def stage_modules(self) -> dict[str, nn.Module]:
        return {w.name: self.stages[w.slot] for w in self.wiring}


def _mask_source(ref: Any, producers: dict[int, Source], mask_producers: dict[int, Source]
                 ) -> MaskSource | None:
    mask = keras_mask(ref)
    if mask is None:
        return None
    if id(mask) in producers:
        return ("value", *producers[id(mask)])
    if id(mask) in mask_producers:
        return ("mask", *mask_producers[id(mask)])
    return None


def assemble(plan: MigrationPlan, plan_dir: str | Path, model: Any | None = None
             ) -> AssembledModel:
    """One ``nn.Module`` from a plan whose every stage runs in Torch (Functional models)."""
    runner = PlanRunner(plan, plan_dir, model)
    staged = runner.staged
    if not staged.functional:
        raise MigrationError("only Functional models assemble into one module: a subclassed "
                             "model's call() is Python that wires its stages; port call() to "
                             "an nn.Module holding the plan's stage modules")
    in_tf = [n for n in staged.names if runner.runtime(n) != "torch"]
    if in_tf:
        raise MigrationError(f"stages {in_tf} still run in TF; move them to Torch (xgr "
                             "migrate auto / swap) before assembling")
    model = staged.model
    producers: dict[int, Source] = {id(ref): (-1, i) for i, ref in enumerate(model.inputs)}
    mask_producers: dict[int, Source] = {}
    wiring, modules = [], nn.ModuleDict()
    for index, name in enumerate(staged.names):
        call, module = staged.call(name), runner.modules[name]
        sources = tuple(producers[id(x)] for x in call.inputs)
        mask_sources = tuple(_mask_source(x, producers, mask_producers) for x in call.inputs)
        output_masks = tuple(keras_mask(x) is not None for x in call.outputs)
        _check_masks(name, module, call.layer, mask_sources, output_masks)
        for position, ref in enumerate(call.outputs):
            producers[id(ref)] = (index, position)
            mask = keras_mask(ref)
            if mask is not None:
                mask_producers[id(mask)] = (index, position)
        modules[_slot(name)] = module
        wiring.append(StageWiring(name, _slot(name), sources, mask_sources, len(call.outputs),
                                  output_masks))
    outputs = tuple(producers[id(ref)] for ref in model.outputs)
    from bridge.migration.functional import output_names
    open_dims = [tuple(d for d, size in enumerate(x.shape) if size is None) for x in model.inputs]
    return AssembledModel(modules, wiring, [x.name for x in model.inputs], outputs,
                          output_names(model), open_dims).eval()


def _check_masks(name: str, module: nn.Module, layer: Any,
                 mask_sources: tuple[MaskSource | None, ...],
                 output_masks: tuple[bool, ...]) -> None:
    """Refuse a stage whose masks the assembled module could not carry (see module doc)."""
    if isinstance(module, OnnxGraphModule):
        missing = [i for i in module.spec.mask_inputs if mask_sources[i] is None]
        if missing or len(module.spec.mask_outputs) != sum(output_masks):
            raise MigrationError(f"stage {name!r}: converted with masks on inputs "
                                 f"{list(module.spec.mask_inputs)} / outputs "
                                 f"{list(module.spec.mask_outputs)}, which the model's graph "
                                 "does not match; reconvert it")
        return
    carried = [i for i, s in enumerate(mask_sources) if s is not None]
    if carried and takes_mask(getattr(layer, "call", None)) and not takes_mask(module.forward):
        raise MigrationError(f"stage {name!r}: inputs {carried} carry Keras masks that the "
                             f"layer reads, but {type(module).__name__}.forward takes no mask")
    if any(output_masks) and not getattr(module, "returns_mask", False):
        raise MigrationError(f"stage {name!r}: the TF layer gives its output a Keras mask; "
                             f"{type(module).__name__} does not return one (returns_mask = "
                             "True and return (output, mask)), and without TF nothing else "
                             "can compute it")


def data_dependent_stages(assembled: AssembledModel) -> dict[str, list[str]]:
    """Stage -> the data-dependent ONNX ops in its converted graph."""
    found = {}
    for name, module in assembled.stage_modules().items():
        if isinstance(module, OnnxGraphModule):
            ops = sorted({n.op_type for n in module.spec.nodes} & DATA_DEPENDENT_OPS)
            if ops:
                found[name] = ops
    return found


def example_inputs(assembled: AssembledModel, batch: Any) -> list[torch.Tensor]:
    """A batch (input name -> array or TF tensor) as the assembled model's torch inputs."""
    import numpy as np

    missing = [n for n in assembled.input_names if n not in batch]
    if missing:
        raise MigrationError(f"the example batch lacks inputs {missing}; the model takes "
                             f"{list(assembled.input_names)}")
    return [torch.from_numpy(np.array(batch[n])) for n in assembled.input_names]


def export_assembled(assembled: AssembledModel, example_inputs: Sequence[torch.Tensor],
                     dynamic: bool = True):
    """``torch.export`` the assembled model. With ``dynamic``, every dimension the Keras
    model leaves open (batch, sequence lengths) stays dynamic (``Dim.AUTO``: torch works out
    which are equal). An export failure names the stages whose sizes depend on the data, with
    torch's reason."""
    from torch.export import Dim, export

    from xgr_common.import_order import check_triton_importable

    check_triton_importable()   # torch.export may import triton: it must come before TF
    shapes = None
    if dynamic:
        # One entry: forward's single var-positional parameter holds every input.
        shapes = (tuple({d: Dim.AUTO for d in dims} if x.dim() else None
                        for x, dims in zip(example_inputs, assembled.open_dims)),)
    try:
        with torch.no_grad():
            return export(assembled, tuple(example_inputs), dynamic_shapes=shapes)
    except Exception as error:  # torch.export raises many unrelated classes
        reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
        dependent = data_dependent_stages(assembled)
        if dependent:
            listed = "; ".join(f"{n} ({', '.join(ops)})" for n, ops in dependent.items())
            raise ExportError(f"torch.export failed; stages whose sizes depend on the data: "
                              f"{listed}. {reason}") from error
        raise ExportError(f"torch.export failed: {reason}") from error
