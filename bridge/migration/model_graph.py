"""Walk a Keras Functional model stage by stage, letting chosen stages run as other callables.

A *stage* is one call of a named layer (``name``; a layer called twice gives ``name`` and
``name#1``). The walk mirrors ``keras.Functional.call`` (Keras 3: nodes by decreasing depth,
arguments filled in from computed tensors) so the all-TF walk reproduces ``model(inputs)``,
and records every stage's outputs: the boundaries the parity harness compares.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import keras
import tensorflow as tf

from bridge.migration.plan import check_import_spec
from torch_engine.errors import InvalidInputError, MigrationError

# stage name -> replacement: called with the node's filled-in (args, kwargs), returns a flat
# list of output tensors (one per Keras output of the node).
Replacement = Callable[[tuple, dict], list]


def import_object(spec: str, what: str) -> Any:
    """Import ``pkg.mod:Name``; errors name ``what`` and the spec."""
    module_name, _, attr = check_import_spec(spec, what).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise MigrationError(f"{what} {spec!r}: cannot import {module_name!r} ({error})") from None
    if not hasattr(module, attr):
        raise MigrationError(f"{what} {spec!r}: module {module_name!r} has no {attr!r}")
    return getattr(module, attr)


def build_model(factory: str) -> keras.Model:
    """Call the plan's model factory; it must return a Keras Functional model."""
    model = import_object(factory, "model factory")()
    if not isinstance(model, keras.Model) or not hasattr(model, "_nodes_by_depth"):
        raise MigrationError(f"model factory {factory!r} must return a Keras Functional model "
                             f"(keras.Model(inputs, outputs)), got {type(model).__name__}")
    return model


@dataclass(frozen=True)
class StageCall:
    """One stage: its name, the layer, and the Keras node of this call."""

    name: str
    layer: Any
    node: Any


def stage_calls(model: keras.Model) -> list[StageCall]:
    """Every stage of ``model`` in execution order."""
    calls, seen = [], {}
    for depth in sorted(model._nodes_by_depth, reverse=True):
        for node in model._nodes_by_depth[depth]:
            if not node.operation or node.is_input:
                continue
            base = node.operation.name
            count = seen.get(base, 0)
            seen[base] = count + 1
            calls.append(StageCall(base if count == 0 else f"{base}#{count}", node.operation, node))
    return calls


def model_inputs(model: keras.Model, batch: Mapping[str, Any]) -> list:
    """Order ``batch`` (input name -> array or tensor) as the model's flat inputs."""
    names = [x.name for x in model.inputs]
    missing, extra = set(names) - set(batch), set(batch) - set(names)
    if missing or extra:
        raise InvalidInputError(f"batch must hold exactly the model inputs {names}; "
                                f"missing {sorted(missing)}, unexpected {sorted(extra)}")
    flat = []
    for ref in model.inputs:
        value = batch[ref.name]
        if not isinstance(value, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)):
            value = tf.convert_to_tensor(value, dtype=ref.dtype)
        flat.append(value)
    return flat


def run_stages(model: keras.Model, batch: Mapping[str, Any],
               replacements: Mapping[str, Replacement] | None = None
               ) -> tuple[list, dict[str, list]]:
    """Run ``model`` on ``batch``; returns (flat model outputs, stage name -> flat outputs)."""
    replacements = replacements or {}
    computed = {id(ref): value for ref, value in zip(model.inputs, model_inputs(model, batch))}
    boundaries: dict[str, list] = {}
    for call in stage_calls(model):
        node = call.node
        if any(id(x) not in computed for x in node.input_tensors):
            continue   # not reachable from the inputs, as in Keras
        args, kwargs = node.arguments.fill_in(computed)
        if call.name in replacements:
            outputs = list(replacements[call.name](args, kwargs))
            if len(outputs) != len(node.outputs):
                raise MigrationError(f"stage {call.name!r}: Torch stage returned {len(outputs)} "
                                     f"outputs, the TF layer has {len(node.outputs)}")
        else:
            outputs = keras.tree.flatten(call.layer(*args, **kwargs))
        for ref, value in zip(node.outputs, outputs):
            computed[id(ref)] = value
        boundaries[call.name] = outputs
    return [computed[id(ref)] for ref in model.outputs], boundaries


def output_names(model: keras.Model) -> list[str]:
    """Names of the model's flat outputs (the output layers' names in Keras 3)."""
    return list(getattr(model, "output_names", None) or
                [f"output_{i}" for i in range(len(model.outputs))])
