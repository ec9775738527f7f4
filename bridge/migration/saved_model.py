"""SavedModels and ``tf.Module``s as migration plans: one stage per function or signature.

A plan's model must be a Keras model with stages. A ``tf.Module`` (or a SavedModel loaded
with ``tf.saved_model.load``) is not one, and ``keras.layers.TFSMLayer`` cannot call a
signature with several inputs. :class:`FunctionStage` wraps one ``tf.function`` or signature
as a Keras 3 layer that takes its inputs positionally; a factory wires the wrappers into a
Functional model, one stage per function, as the module's own code chains the functions::

    def build():
        ranker = tf.saved_model.load("ranker/")             # or RankerModule()
        values = keras.Input((8,), name="values")
        row_splits = keras.Input((), dtype="int64", name="row_splits")
        pooled = FunctionStage(ranker.pool, name="pool")(values, row_splits)
        score = FunctionStage(ranker.score, name="score")(pooled)
        return keras.Model([values, row_splits], score)

:func:`signature_model` builds that model for a single signature (a SavedModel's
``serving_default``): its inputs, named as in the signature, and one stage.
"""

from __future__ import annotations

from typing import Any, Sequence

import keras
import tensorflow as tf

from xgr_common.errors import MigrationError


def concrete_function(fn: Any, where: str) -> Any:
    """The one concrete function of ``fn`` (a ConcreteFunction, a signature, or a
    ``tf.function`` / restored function traced with one input signature)."""
    if hasattr(fn, "structured_input_signature") and hasattr(fn, "structured_outputs"):
        return fn
    try:
        return fn.get_concrete_function()
    except (AttributeError, TypeError, ValueError) as error:
        raise MigrationError(f"{where}: needs a tf.function with an input_signature (or a "
                             f"SavedModel signature), got {type(fn).__name__}: {error}") from None


class FunctionStage(keras.layers.Layer):
    """One ``tf.function`` or SavedModel signature as a Keras layer (a stage).

    ``call(*tensors)`` passes the tensors in ``input_names`` order (default: the function's
    positional order, or a signature's input names sorted) and returns the outputs in
    ``output_names`` order (default: a dict's sorted keys), one tensor or a list.
    """

    def __init__(self, fn: Any, input_names: Sequence[str] | None = None,
                 output_names: Sequence[str] | None = None, **kwargs):
        super().__init__(**kwargs)
        where = f"stage {self.name!r}"
        self.function = concrete_function(fn, where)
        args, kwargs_spec = self.function.structured_input_signature
        self._keyword = not args
        # A signature's inputs are a proto map, whose order differs between processes: they
        # are taken in sorted order, so a converted stage reads them the same way everywhere.
        specs = dict(sorted(kwargs_spec.items())) if self._keyword else {
            spec.name or f"arg_{i}": spec for i, spec in enumerate(tf.nest.flatten(args))}
        self.input_names = list(input_names or specs)
        unknown = sorted(set(self.input_names) - set(specs))
        if unknown or len(self.input_names) != len(specs):
            raise MigrationError(f"{where}: input_names {self.input_names} must name each of "
                                 f"the function's inputs {list(specs)} once")
        self.input_specs = [specs[n] for n in self.input_names]
        outputs = self.function.structured_outputs
        if isinstance(outputs, dict):
            self.output_names = list(output_names or sorted(outputs))
            self._output_specs = [outputs[n] for n in self.output_names]
        else:
            self._output_specs = tf.nest.flatten(outputs)
            self.output_names = list(output_names or
                                     [f"output_{i}" for i in range(len(self._output_specs))])
        self._output_is_dict = isinstance(outputs, dict)

    def call(self, *tensors):
        if len(tensors) != len(self.input_names):
            raise MigrationError(f"stage {self.name!r} takes {len(self.input_names)} tensors "
                                 f"{self.input_names}, got {len(tensors)}")
        tensors = [tf.cast(t, spec.dtype) if t.dtype != spec.dtype else t
                   for t, spec in zip(tensors, self.input_specs)]
        if self._keyword:
            result = self.function(**dict(zip(self.input_names, tensors)))
        else:
            result = self.function(*tensors)
        flat = [result[n] for n in self.output_names] if self._output_is_dict \
            else tf.nest.flatten(result)
        return flat[0] if len(flat) == 1 else flat

    def compute_output_spec(self, *tensors):
        specs = [keras.KerasTensor(tuple(s.shape), dtype=s.dtype.name)
                 for s in self._output_specs]
        return specs[0] if len(specs) == 1 else specs


def signature_model(source: Any, signature: str = "serving_default",
                    name: str | None = None) -> keras.Model:
    """A Functional model of one signature: inputs named as the signature's, one stage.
    ``source``: a SavedModel path, or an object from ``tf.saved_model.load``."""
    loaded = tf.saved_model.load(str(source)) if isinstance(source, (str, bytes)) or \
        hasattr(source, "__fspath__") else source
    signatures = getattr(loaded, "signatures", {})
    if signature not in signatures:
        raise MigrationError(f"SavedModel has no signature {signature!r}; it has "
                             f"{sorted(signatures)}")
    stage = FunctionStage(signatures[signature], name=name or signature.replace("/", "_"))
    inputs = [keras.Input(tuple(spec.shape[1:]), batch_size=None, dtype=spec.dtype.name,
                          name=input_name)
              for input_name, spec in zip(stage.input_names, stage.input_specs)]
    outputs = stage(*inputs)
    model = keras.Model(inputs, outputs, name=f"saved_model_{stage.name}")
    model._saved_model = loaded    # keeps the restored variables alive with the model
    return model
