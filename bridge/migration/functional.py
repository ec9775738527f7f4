"""The layer calls of a Functional model, read the same way from Keras 3 and from tf_keras.

Both Kerases keep the graph in ``model._nodes_by_depth``; a node is one call of one layer, with
the symbolic arguments it was called with. Their node classes differ (Keras 3:
``node.operation`` / ``node.arguments``; tf_keras: ``node.layer`` / ``node.call_args``), so
:class:`LayerCall` holds what the walk needs from either: the layer, the symbolic arguments,
the symbolic inputs and outputs, and ``fill_in`` to put computed tensors in their place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from bridge.migration.keras_flavours import is_keras_tensor


@dataclass(frozen=True)
class LayerCall:
    """One call of a layer in a Functional graph; ``name`` is its stage name."""

    name: str
    layer: Any
    args: tuple            # symbolic positional arguments (Keras tensors where tensors go)
    kwargs: dict
    inputs: tuple          # the Keras tensors among the arguments, flat
    outputs: tuple         # the call's Keras output tensors, flat

    def fill_in(self, computed: dict[int, Any]) -> tuple[tuple, dict]:
        """The call's arguments with each Keras tensor replaced by ``computed[id(tensor)]``."""
        return tf.nest.map_structure(
            lambda x: computed[id(x)] if is_keras_tensor(x) else x, (self.args, self.kwargs))

    @property
    def call_index(self) -> int:
        """0 for a layer's first call, 1 for its second, ... (from the stage name)."""
        return int(self.name.rpartition("#")[2]) if "#" in self.name else 0


def _node_parts(node: Any) -> tuple[Any, tuple, dict, tuple]:
    if hasattr(node, "operation"):                       # Keras 3
        return (node.operation, tuple(node.arguments.args), dict(node.arguments.kwargs),
                tuple(tf.nest.flatten(node.outputs)))
    return (node.layer, tuple(node.call_args), dict(node.call_kwargs),   # tf_keras
            tuple(tf.nest.flatten(node.outputs)))


def is_functional(model: Any) -> bool:
    return hasattr(model, "_nodes_by_depth") and bool(getattr(model, "inputs", None))


def _call_number(layer: Any, node: Any, in_model: set[int]) -> int:
    """The position of ``node`` among ``layer``'s calls in this model, in the order the model
    code made them (not the execution order: a shared layer's ``#1`` is its second call)."""
    mine = [n for n in getattr(layer, "_inbound_nodes", ()) if id(n) in in_model]
    return next((i for i, n in enumerate(mine) if n is node), 0)


def layer_calls(model: Any) -> list[LayerCall]:
    """Every layer call of ``model`` in execution order (decreasing depth, as both Kerases run
    them). A layer called twice gives stages ``name`` (its first call in the model code) and
    ``name#1`` (its second); Keras 3 ops in the graph are named by op (``not_equal``,
    ``not_equal#1``, ...)."""
    nodes = [node for depth in sorted(model._nodes_by_depth, reverse=True)
             for node in model._nodes_by_depth[depth] if not node.is_input]
    in_model = {id(node) for node in nodes}
    calls, op_counts = [], {}
    for node in nodes:
        layer, args, kwargs, outputs = _node_parts(node)
        if layer is None:
            continue
        if _is_layer(layer):
            number, base = _call_number(layer, node, in_model), layer.name
        else:
            # A Keras 3 op (keras.ops.not_equal for a mask, ...): its name carries a counter
            # global to the process, so it is numbered within the model instead.
            base = _OP_SUFFIX.sub("", layer.name)
            number = op_counts.get(base, 0)
            op_counts[base] = number + 1
        inputs = tuple(x for x in tf.nest.flatten((args, kwargs)) if is_keras_tensor(x))
        calls.append(LayerCall(base if number == 0 else f"{base}#{number}", layer,
                               args, kwargs, inputs, outputs))
    return calls


_OP_SUFFIX = re.compile(r"_\d+$")


def _is_layer(operation: Any) -> bool:
    return any(cls.__name__ == "Layer" for cls in type(operation).__mro__)


def input_sources(call: LayerCall) -> list[str]:
    """For reports: the name of the layer (or model input) each input of ``call`` comes from."""
    names = []
    for x in call.inputs:
        history = getattr(x, "_keras_history", None)
        layer = getattr(history, "operation", None) or getattr(history, "layer", None) \
            if history is not None else None
        names.append(getattr(layer, "name", None) or getattr(x, "name", "?"))
    return names


def output_names(model: Any) -> list[str]:
    """The model's output names, made unique (Keras 3 names outputs after their layer, so a
    layer with two outputs gives one name twice): ``score``, ``score#1``."""
    names = list(getattr(model, "output_names", None) or
                 [f"output_{i}" for i in range(len(model.outputs))])
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        unique.append(name if count == 0 else f"{name}#{count}")
    return unique
