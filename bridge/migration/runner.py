"""Execute a Keras model under a migration plan: TF stages in TF, Torch stages in Torch.

Stage boundaries cross through the DLPack bridge (``bridge.dlpack``): a Torch stage receives
its layer's input tensors (flattened in call order) as torch tensors, zero-copy where the bridge
allows, and its outputs go back to TF the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import tensorflow as tf
import torch
from torch import nn

from bridge import to_tf, to_torch
from bridge.migration.keras_flavours import keras_mask, set_keras_mask
from bridge.migration.masks import takes_mask, tf_output_mask
from bridge.migration.stages import (Outputs, Replacement, StagedModel, StageError, build_model,
                                     import_object)
from bridge.migration.plan import MigrationPlan, StagePlan
from bridge.onnx_torch.module import OnnxGraphModule
from xgr_common.errors import BridgeError, MigrationError


def build_torch_stage(stage: StagePlan, layer: Any, plan_dir: Path) -> nn.Module:
    """The ``nn.Module`` of a Torch stage, in eval mode."""
    if stage.converted is not None:
        try:
            module = OnnxGraphModule.load(plan_dir / stage.converted)
        except MigrationError as error:
            raise MigrationError(f"stage {stage.name!r}: {error}") from None
    else:
        cls = import_object(stage.module, f"stage {stage.name!r}: module")
        factory = getattr(cls, "from_keras_layer", None)
        try:
            module = factory(layer, **stage.kwargs) if factory else cls(**stage.kwargs)
        except MigrationError:
            raise
        except Exception as error:  # a team's constructor raises whatever it raises
            how = "from_keras_layer(layer)" if factory else "Class(**kwargs)"
            raise MigrationError(f"stage {stage.name!r}: {stage.module}.{how} failed for the "
                                 f"{type(layer).__name__} layer: {type(error).__name__}: "
                                 f"{error}") from error
        if not isinstance(module, nn.Module):
            raise MigrationError(f"stage {stage.name!r}: {stage.module} built a "
                                 f"{type(module).__name__}, expected a torch.nn.Module")
    return module.eval()


def _crossing(name: str, tensors: list) -> list[torch.Tensor]:
    inputs = []
    for i, x in enumerate(tensors):
        if not isinstance(x, tf.Tensor):
            raise StageError(name, f"input {i} is a {type(x).__name__}; a Torch stage takes "
                                   "dense tensors only")
        try:
            inputs.append(to_torch(x))
        except BridgeError as error:
            raise StageError(name, f"input {i} cannot cross into Torch: {error}") from None
    return inputs


def torch_replacement(name: str, module: nn.Module, layer: Any) -> Replacement:
    """Wrap ``module`` so the walk can call it with the stage's TF arguments; Keras masks
    cross with their tensors (:mod:`bridge.migration.masks`)."""
    converted = isinstance(module, OnnxGraphModule)
    spec_masks = module.spec.mask_inputs if converted else ()
    layer_reads_masks = takes_mask(getattr(layer, "call", None))
    forward_takes_mask = takes_mask(module.forward)
    returns_mask = bool(getattr(module, "returns_mask", False))

    def call(args: tuple, kwargs: dict) -> list:
        tensors = [x for x in tf.nest.flatten((args, kwargs)) if tf.is_tensor(x)]
        masks = [keras_mask(x) for x in tensors]
        carried = [i for i, m in enumerate(masks) if m is not None]
        inputs = _crossing(name, tensors)
        extra: dict = {}
        if converted:
            missing = [i for i in spec_masks if masks[i] is None]
            unused = [i for i in carried if i not in spec_masks]
            if missing:
                raise StageError(name, f"inputs {missing} carry no Keras mask, but the stage "
                                       "was converted with their masks")
            if unused and layer_reads_masks:
                raise StageError(name, f"inputs {unused} carry Keras masks the converted stage "
                                       "does not take (it was converted without them): "
                                       "reconvert it with `xgr migrate auto`")
            inputs += _crossing(name, [masks[i] for i in spec_masks])
        elif carried and forward_takes_mask:
            crossed = [to_torch(m) if m is not None else None for m in masks]
            extra["mask"] = crossed[0] if len(crossed) == 1 else tuple(crossed)
        elif carried and layer_reads_masks:
            raise StageError(name, f"inputs {carried} carry Keras masks that the TF layer "
                                   f"reads, but {type(module).__name__}.forward takes no "
                                   "`mask` argument: moving it would lose the mask")
        try:
            with torch.inference_mode():
                result = module(*inputs, **extra)
        except Exception as error:  # a team's module raises whatever it raises
            shapes = ", ".join(f"{x.dtype}{list(x.shape)}".replace("torch.", "") for x in inputs)
            raise StageError(name, f"the Torch module failed on inputs {shapes}: "
                                   f"{type(error).__name__}: {error}") from error
        results = [to_tf(r) for r in (result if isinstance(result, (tuple, list)) else (result,))]
        if converted:
            count = len(results) - len(module.spec.mask_outputs)
            for position, mask in zip(module.spec.mask_outputs, results[count:]):
                set_keras_mask(results[position], mask)
            return results[:count]
        if returns_mask:
            if len(results) != 2:
                raise StageError(name, f"{type(module).__name__} has returns_mask = True, so "
                                       f"it returns (output, mask); it returned {len(results)} "
                                       "tensors")
            return [set_keras_mask(results[0], results[1])]
        mask = tf_output_mask(layer, args, kwargs)
        for r in results:
            set_keras_mask(r, mask)
        return results
    return call


class PlanRunner:
    """Builds the plan's model and Torch stages once; ``run`` executes a batch under the plan."""

    def __init__(self, plan: MigrationPlan, plan_dir: str | Path,
                 model: Any | None = None):
        self.plan = plan
        self.plan_dir = Path(plan_dir)
        self.model = model if model is not None else build_model(plan.model, plan.keras)
        self.staged = StagedModel(self.model)
        plan.check_stages_exist(self.staged.names)
        self.modules: dict[str, nn.Module] = {
            s.name: build_torch_stage(s, self.staged.layer(s.name), self.plan_dir)
            for s in plan.torch_stages()}
        self._replacements = {name: torch_replacement(name, m, self.staged.layer(name))
                              for name, m in self.modules.items()}

    def run(self, batch: Mapping[str, Any]) -> tuple[Outputs, dict[str, list]]:
        """Returns (named model outputs, stage call -> flat stage outputs), all TF values.
        A stage that fails raises a StageError naming it."""
        return self.staged.run(batch, self._replacements)

    def run_reference(self, batch: Mapping[str, Any], input_shapes: dict | None = None
                      ) -> tuple[Outputs, dict[str, list]]:
        """The same batch with every stage in TF: the original model."""
        return self.staged.run(batch, input_shapes=input_shapes)

    def runtime(self, stage: str) -> str:
        """Where a stage call runs under the plan (``name#k`` runs where ``name`` does for
        subclassed models, whose replacements apply to every call)."""
        if self.plan.stage(stage).runtime == "torch":
            return "torch"
        base = stage.partition("#")[0]
        return "torch" if not self.staged.functional and \
            self.plan.stage(base).runtime == "torch" else "tf"
