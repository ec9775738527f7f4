"""Execute a Keras model under a migration plan: TF stages in TF, Torch stages in Torch.

Stage boundaries cross through the DLPack bridge (``bridge.dlpack``): a Torch stage receives
its layer's input tensors (flattened in call order) as torch tensors, zero-copy where the bridge
allows, and its outputs go back to TF the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import keras
import tensorflow as tf
import torch
from torch import nn

from bridge import to_tf, to_torch
from bridge.migration.stages import Outputs, Replacement, StagedModel, build_model, import_object
from bridge.migration.plan import MigrationPlan, StagePlan
from bridge.onnx_torch.module import OnnxGraphModule
from xgr_common.errors import BridgeError, MigrationError


def build_torch_stage(stage: StagePlan, layer: Any, plan_dir: Path) -> nn.Module:
    """The ``nn.Module`` of a Torch stage, in eval mode."""
    if stage.converted is not None:
        module = OnnxGraphModule.load(plan_dir / stage.converted)
    else:
        cls = import_object(stage.module, f"stage {stage.name!r}: module")
        factory = getattr(cls, "from_keras_layer", None)
        module = factory(layer, **stage.kwargs) if factory else cls(**stage.kwargs)
        if not isinstance(module, nn.Module):
            raise MigrationError(f"stage {stage.name!r}: {stage.module} built a "
                                 f"{type(module).__name__}, expected a torch.nn.Module")
    return module.eval()


def torch_replacement(name: str, module: nn.Module) -> Replacement:
    """Wrap ``module`` so the walk can call it with the stage's TF arguments."""
    def call(args: tuple, kwargs: dict) -> list:
        tensors = [x for x in keras.tree.flatten((args, kwargs)) if tf.is_tensor(x)]
        inputs = []
        for i, x in enumerate(tensors):
            if not isinstance(x, tf.Tensor):
                raise MigrationError(f"stage {name!r}: input {i} is a {type(x).__name__}; "
                                     "a Torch stage takes dense tensors only")
            try:
                inputs.append(to_torch(x))
            except BridgeError as error:
                raise MigrationError(f"stage {name!r}: input {i} cannot cross into Torch: "
                                     f"{error}") from None
        with torch.inference_mode():
            result = module(*inputs)
        results = result if isinstance(result, (tuple, list)) else (result,)
        return [to_tf(r) for r in results]
    return call


class PlanRunner:
    """Builds the plan's model and Torch stages once; ``run`` executes a batch under the plan."""

    def __init__(self, plan: MigrationPlan, plan_dir: str | Path,
                 model: keras.Model | None = None):
        self.plan = plan
        self.plan_dir = Path(plan_dir)
        self.model = model if model is not None else build_model(plan.model)
        self.staged = StagedModel(self.model)
        plan.check_stages_exist(self.staged.names)
        self.modules: dict[str, nn.Module] = {
            s.name: build_torch_stage(s, self.staged.layer(s.name), self.plan_dir)
            for s in plan.torch_stages()}
        self._replacements = {name: torch_replacement(name, m) for name, m in self.modules.items()}

    def run(self, batch: Mapping[str, Any]) -> tuple[Outputs, dict[str, list]]:
        """Returns (named model outputs, stage call -> flat stage outputs), all TF values."""
        return self.staged.run(batch, self._replacements)

    def run_reference(self, batch: Mapping[str, Any]) -> tuple[Outputs, dict[str, list]]:
        """The same batch with every stage in TF: the original model."""
        return self.staged.run(batch)
