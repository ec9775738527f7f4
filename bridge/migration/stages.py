"""A model's stages, run one by one, with chosen stages replaced by other callables.

Two kinds of Keras model have stages, in Keras 3 and in tf_keras (Keras 2) alike:

* **Functional** models (``keras.Model(inputs, outputs)``): a stage is one call of a named
  layer (a layer called twice gives ``name`` and ``name#1``, in the order the model code calls
  it). The walk mirrors ``Functional.call`` (nodes by decreasing depth, arguments filled in
  from the computed tensors), so the all-TF walk reproduces ``model(inputs)``.
* **Staged subclassed** models that expose ``stage(name)`` and ``replace_stage(name, layer)``
  (``tf_frontend.feature_graph.FeatureGraph``): the stages are the model's layers; each run
  swaps in recording hooks and restores the layers afterwards. Repeated calls of one stage are
  recorded as ``name``, ``name#1``, ...; a replacement applies to every call.

Every run records each stage call's flat outputs: the boundaries the parity harness compares.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

import tensorflow as tf

from bridge.migration.functional import (LayerCall, input_sources, is_functional, layer_calls,
                                         output_names)
from bridge.migration.keras_flavours import check_process, flavour_of, is_keras_model
from bridge.migration.plan import check_import_spec
from xgr_common.errors import InvalidInputError, MigrationError

# stage name -> replacement: called with a stage call's (args, kwargs), returns a flat list of
# output tensors (one per output of the layer).
Replacement = Callable[[tuple, dict], list]
Outputs = list[tuple[str, Any]]          # (output name, value), in the model's order


class StageError(MigrationError):
    """A stage failed while the model ran; ``stage`` names it (for reports)."""

    def __init__(self, stage: str, message: str):
        super().__init__(f"stage {stage!r}: {message}")
        self.stage = stage
        self.boundaries: dict[str, list] = {}   # the stage outputs computed before it failed


def check_stage_outputs(name: str, outputs: list, refs: tuple) -> None:
    """Raise a StageError when a replaced stage's outputs do not have the dtype and static
    shape of the layer's symbolic outputs (``None`` dimensions may take any size)."""
    for i, (value, ref) in enumerate(zip(outputs, refs)):
        want_dtype = tf.as_dtype(ref.dtype)
        want = list(ref.shape)
        got = list(value.shape)
        fits = len(got) == len(want) and all(w is None or w == g for w, g in zip(want, got))
        if value.dtype != want_dtype or not fits:
            raise StageError(name, f"output {i} of the Torch stage is {value.dtype.name}"
                                   f"{got}; the TF layer gives {want_dtype.name}{want} "
                                   "(None: any size)")


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


def has_stage_methods(model: Any) -> bool:
    return callable(getattr(model, "stage", None)) and \
        callable(getattr(model, "replace_stage", None))


def check_model(model: Any, factory: str) -> Any:
    """``model`` if it has stages (see the module doc); else a MigrationError saying why."""
    flavour = flavour_of(model)
    if not is_keras_model(model):
        raise MigrationError(f"model factory {factory!r} returned a {type(model).__module__}."
                             f"{type(model).__name__}, not a Keras model (keras 3 or tf_keras); "
                             "for a SavedModel or tf.Module wrap each function in a stage layer "
                             "(bridge.migration.saved_model)")
    if not (is_functional(model) or has_stage_methods(model)):
        raise MigrationError(f"model factory {factory!r} returned a subclassed {flavour} model "
                             f"({type(model).__name__}) without stages: a subclassed model needs "
                             "stage(name) and replace_stage(name, layer) methods (see "
                             "tf_frontend/feature_graph.py), or build it as a Functional model")
    return model


def build_model(factory: str, flavour: str | None = None) -> Any:
    """Call the plan's model factory; it must return a model with stages (see module doc).
    ``flavour``: the Keras the plan says the model is written in, checked against this
    process (TF reads ``TF_USE_LEGACY_KERAS`` once, at import)."""
    if flavour is not None:
        check_process(flavour, f"model factory {factory!r}")
    model = import_object(factory, "model factory")
    try:
        model = model()
    except MigrationError:
        raise
    except Exception as error:  # a team's factory raises whatever it raises
        raise MigrationError(f"model factory {factory!r} failed: {type(error).__name__}: "
                             f"{error}") from error
    model = check_model(model, factory)
    if flavour is not None and flavour_of(model) != flavour:
        raise MigrationError(f"model factory {factory!r} returned a {flavour_of(model)} model, "
                             f"the plan says keras {flavour!r}")
    return model


class StagedModel:
    """One interface over both kinds: stage names, their layers, and runs with replacements."""

    def __init__(self, model: Any):
        self.model = model
        self._shapes: dict[str, list] | None = None
        self._boundaries: dict[str, list] = {}
        self._check = True
        self.flavour = flavour_of(model)
        self.functional = is_functional(model)
        if self.functional:
            self._calls = layer_calls(model)
            self.names = [call.name for call in self._calls]
            self._layers = {call.name: call.layer for call in self._calls}
        else:
            self.names = [layer.name for layer in model.layers]
            self._layers = {name: model.stage(name) for name in self.names}

    def layer(self, name: str) -> Any:
        if name not in self._layers:
            raise MigrationError(f"unknown stage {name!r}; the model's stages are {self.names}")
        return self._layers[name]

    def call(self, name: str) -> LayerCall:
        """The layer call of a Functional stage (its symbolic inputs and outputs)."""
        self.layer(name)
        return next(call for call in self._calls if call.name == name)

    def sources(self, name: str) -> list[str]:
        """Where a Functional stage's inputs come from (layer or input names); [] otherwise."""
        return input_sources(self.call(name)) if self.functional else []

    def run(self, batch: Mapping[str, Any], replacements: Mapping[str, Replacement] | None = None,
            input_shapes: dict[str, list] | None = None, check_outputs: bool = True
            ) -> tuple[Outputs, dict[str, list]]:
        """Run on ``batch``; returns (named flat outputs, stage call -> flat outputs). When
        ``input_shapes`` is given, it receives stage call -> its input tensors' shapes.
        ``check_outputs``: replaced stages must give the layer's symbolic dtypes and shapes."""
        replacements = replacements or {}
        unknown = sorted(set(replacements) - set(self.names))
        if unknown:
            raise MigrationError(f"replacements for unknown stages {unknown}; stages: {self.names}")
        self._shapes, self._boundaries, self._check = input_shapes, {}, check_outputs
        try:
            if self.functional:
                return self._run_functional(batch, replacements)
            return self._run_staged(batch, replacements)
        except StageError as error:
            error.boundaries = dict(self._boundaries)
            raise
        finally:
            self._shapes, self._boundaries = None, {}

    def _record_shapes(self, name: str, args: Any) -> None:
        if self._shapes is not None:
            self._shapes[name] = [tuple(x.shape) for x in tf.nest.flatten(args) if tf.is_tensor(x)]

    def _run_functional(self, batch, replacements) -> tuple[Outputs, dict[str, list]]:
        model = self.model
        computed = {id(ref): value for ref, value in zip(model.inputs, _flat_inputs(model, batch))}
        boundaries: dict[str, list] = self._boundaries
        for call in self._calls:
            name = call.name
            if any(id(x) not in computed for x in call.inputs):
                continue   # not reachable from the inputs, as in Keras
            args, kwargs = call.fill_in(computed)
            self._record_shapes(name, (args, kwargs))
            if name in replacements:
                outputs = list(replacements[name](args, kwargs))
                if len(outputs) != len(call.outputs):
                    raise StageError(name, f"the Torch stage returned {len(outputs)} outputs, "
                                           f"the TF layer has {len(call.outputs)}")
                if self._check:
                    check_stage_outputs(name, outputs, call.outputs)
            else:
                outputs = tf.nest.flatten(call.layer(*args, **kwargs))
            for ref, value in zip(call.outputs, outputs):
                computed[id(ref)] = value
            boundaries[name] = outputs
        names = output_names(model)
        return list(zip(names, (computed[id(ref)] for ref in model.outputs))), boundaries

    def _run_staged(self, batch, replacements) -> tuple[Outputs, dict[str, list]]:
        boundaries: dict[str, list] = self._boundaries
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
                self._record_shapes(label, (args, kwargs))
                if name in replacements:
                    outputs = list(replacements[name](args, kwargs))
                    boundaries[label] = outputs
                    return outputs[0] if len(outputs) == 1 else tuple(outputs)
                result = self._layers[name](*args, **kwargs)
                boundaries[label] = tf.nest.flatten(result)
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
        flat = tf.nest.flatten(result)
        return [(f"output_{i}", v) for i, v in enumerate(flat)], boundaries

    def capture(self, batch: Mapping[str, Any], name: str) -> tuple[tuple, dict, list]:
        """The (args, kwargs, flat outputs) of the first call of stage ``name`` on ``batch``."""
        seen: list = []
        layer = self.layer(name)

        def record(args, kwargs):
            outputs = tf.nest.flatten(layer(*args, **kwargs))
            if not seen:
                seen.append((args, kwargs, outputs))
            return outputs
        self.run(batch, {name: record}, check_outputs=False)   # record runs the TF layer
        if not seen:
            raise MigrationError(f"stage {name!r} did not run on the given batch")
        return seen[0]


def _flat_inputs(model: Any, batch: Mapping[str, Any]) -> list:
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
