"""A model's stages, run one by one, with chosen stages replaced by other callables.

Two kinds of Keras model have stages:

* **Functional** models (``keras.Model(inputs, outputs)``): a stage is one call of a named
  layer (a layer called twice gives ``name`` and ``name#1``). The walk mirrors
  ``keras.Functional.call`` (Keras 3: nodes by decreasing depth, arguments filled in from the
  computed tensors), so the all-TF walk reproduces ``model(inputs)``.
* **Staged subclassed** models that expose ``stage(name)`` and ``replace_stage(name, layer)``
  (``tf_frontend.feature_graph.FeatureGraph``): the stages are the model's layers; each run
  swaps in recording hooks and restores the layers afterwards. Repeated calls of one stage are
  recorded as ``name``, ``name#1``, ...; a replacement applies to every call.

Every run records each stage call's flat outputs: the boundaries the parity harness compares.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

import keras
import tensorflow as tf

from bridge.migration.plan import check_import_spec
from xgr_common.errors import InvalidInputError, MigrationError

# stage name -> replacement: called with a stage call's (args, kwargs), returns a flat list of
# output tensors (one per output of the layer).
Replacement = Callable[[tuple, dict], list]
Outputs = list[tuple[str, Any]]          # (output name, value), in the model's order


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


def is_functional(model: Any) -> bool:
    return isinstance(model, keras.Model) and hasattr(model, "_nodes_by_depth")


def build_model(factory: str) -> keras.Model:
    """Call the plan's model factory; it must return a model with stages (see module doc)."""
    model = import_object(factory, "model factory")()
    staged = callable(getattr(model, "stage", None)) and \
        callable(getattr(model, "replace_stage", None))
    if not isinstance(model, keras.Model) or not (is_functional(model) or staged):
        raise MigrationError(f"model factory {factory!r} must return a Keras Functional model "
                             "or a keras.Model with stage(name) and replace_stage(name, layer) "
                             f"methods, got {type(model).__name__}")
    return model


def _functional_calls(model: keras.Model) -> list[tuple[str, Any, Any]]:
    """(stage name, layer, Keras node) of every layer call, in execution order."""
    calls, seen = [], {}
    for depth in sorted(model._nodes_by_depth, reverse=True):
        for node in model._nodes_by_depth[depth]:
            if not node.operation or node.is_input:
                continue
            base = node.operation.name
            count = seen.get(base, 0)
            seen[base] = count + 1
            calls.append((base if count == 0 else f"{base}#{count}", node.operation, node))
    return calls


class StagedModel:
    """One interface over both kinds: stage names, their layers, and runs with replacements."""

    def __init__(self, model: keras.Model):
        self.model = model
        self.functional = is_functional(model)
        if self.functional:
            self._calls = _functional_calls(model)
            self.names = [name for name, _, _ in self._calls]
            self._layers = {name: layer for name, layer, _ in self._calls}
        else:
            self.names = [layer.name for layer in model.layers]
            self._layers = {name: model.stage(name) for name in self.names}

    def layer(self, name: str) -> Any:
        if name not in self._layers:
            raise MigrationError(f"unknown stage {name!r}; the model's stages are {self.names}")
        return self._layers[name]

    def node(self, name: str) -> Any:
        """The Keras node of a Functional stage (its symbolic inputs and outputs)."""
        return next(node for n, _, node in self._calls if n == name)

    def run(self, batch: Mapping[str, Any], replacements: Mapping[str, Replacement] | None = None
            ) -> tuple[Outputs, dict[str, list]]:
        """Run on ``batch``; returns (named flat outputs, stage call -> flat outputs)."""
        replacements = replacements or {}
        unknown = sorted(set(replacements) - set(self.names))
        if unknown:
            raise MigrationError(f"replacements for unknown stages {unknown}; stages: {self.names}")
        if self.functional:
            return self._run_functional(batch, replacements)
        return self._run_staged(batch, replacements)

    def _run_functional(self, batch, replacements) -> tuple[Outputs, dict[str, list]]:
        model = self.model
        computed = {id(ref): value for ref, value in zip(model.inputs, _flat_inputs(model, batch))}
        boundaries: dict[str, list] = {}
        for name, layer, node in self._calls:
            if any(id(x) not in computed for x in node.input_tensors):
                continue   # not reachable from the inputs, as in Keras
            args, kwargs = node.arguments.fill_in(computed)
            if name in replacements:
                outputs = list(replacements[name](args, kwargs))
                if len(outputs) != len(node.outputs):
                    raise MigrationError(f"stage {name!r}: the Torch stage returned "
                                         f"{len(outputs)} outputs, the TF layer has "
                                         f"{len(node.outputs)}")
            else:
                outputs = keras.tree.flatten(layer(*args, **kwargs))
            for ref, value in zip(node.outputs, outputs):
                computed[id(ref)] = value
            boundaries[name] = outputs
        names = list(getattr(model, "output_names", None) or
                     [f"output_{i}" for i in range(len(model.outputs))])
        return list(zip(names, (computed[id(ref)] for ref in model.outputs))), boundaries

    def _run_staged(self, batch, replacements) -> tuple[Outputs, dict[str, list]]:
        boundaries: dict[str, list] = {}
        calls: dict[str, int] = {}

        def hook(name: str) -> Callable:
            def call(*args, **kwargs):
                if not tf.executing_eagerly():
                    # Keras traces an unbuilt model symbolically first (to infer output specs):
                    # that pass runs the TF layer and records nothing.
                    return self._layers[name](*args, **kwargs)
                count = calls.get(name, 0)
                calls[name] = count + 1
                label = name if count == 0 else f"{name}#{count}"
                if name in replacements:
                    outputs = list(replacements[name](args, kwargs))
                    boundaries[label] = outputs
                    return outputs[0] if len(outputs) == 1 else tuple(outputs)
                result = self._layers[name](*args, **kwargs)
                boundaries[label] = keras.tree.flatten(result)
                return result
            return call

        try:
            for name in self.names:
                self.model.replace_stage(name, hook(name))
            result = self.model({k: v if tf.is_tensor(v) else tf.convert_to_tensor(v)
                                 for k, v in batch.items()})
        finally:
            for name in self.names:
                self.model.replace_stage(name, self._layers[name])
        if isinstance(result, Mapping):
            return list(result.items()), boundaries
        flat = keras.tree.flatten(result)
        return [(f"output_{i}", v) for i, v in enumerate(flat)], boundaries

    def capture(self, batch: Mapping[str, Any], name: str) -> tuple[tuple, dict, list]:
        """The (args, kwargs, flat outputs) of the first call of stage ``name`` on ``batch``."""
        seen: list = []
        layer = self.layer(name)

        def record(args, kwargs):
            outputs = keras.tree.flatten(layer(*args, **kwargs))
            if not seen:
                seen.append((args, kwargs, outputs))
            return outputs
        self.run(batch, {name: record})
        if not seen:
            raise MigrationError(f"stage {name!r} did not run on the given batch")
        return seen[0]


def _flat_inputs(model: keras.Model, batch: Mapping[str, Any]) -> list:
    """Order ``batch`` (input name -> array or tensor) as a Functional model's flat inputs."""
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
