"""Hand-written Torch twins of common Keras layers, built from a Keras layer's weights.

Use them in a plan as ``{"runtime": "torch", "module": "bridge.migration.keras_twins:Dense"}``:
the runner calls ``Class.from_keras_layer(layer)``, which copies the layer's weights. They are
also the reference for writing a team's own: Keras ``Dense`` keeps its kernel as
``[in, out]``, ``nn.Linear`` as ``[out, in]``, hence the transpose.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from bridge.migration.keras_flavours import TF_KERAS, flavour_of, is_layer_class
from xgr_common.errors import MigrationError

# Keras activation name -> torch function (same formulas; Keras "gelu" is the exact erf form).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "linear": lambda x: x, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
    "silu": nn.functional.silu, "swish": nn.functional.silu, "gelu": nn.functional.gelu,
    "softmax": lambda x: torch.softmax(x, dim=-1),
}


def _weight(array: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(np.asarray(array), dtype=np.float32))


def activation_name(layer: Any) -> str:
    """The Keras layer's activation as a key of :data:`ACTIVATIONS` (either Keras)."""
    if flavour_of(layer) == TF_KERAS:
        import tf_keras as keras_module
    else:
        import keras as keras_module
    name = keras_module.activations.serialize(layer.activation)
    name = name if isinstance(name, str) else name.get("config", name.get("class_name"))
    if name not in ACTIVATIONS:
        raise MigrationError(f"layer {layer.name!r}: activation {name!r} has no Torch twin; "
                             f"known: {sorted(ACTIVATIONS)}")
    return name


class Dense(nn.Module):
    """``keras.layers.Dense``: ``activation(x @ kernel + bias)``; x ``[..., in]`` float32."""

    def __init__(self, in_features: int, out_features: int, activation: str = "linear",
                 use_bias: bool = True):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise MigrationError(f"Dense: activation {activation!r} unknown; "
                                 f"known: {sorted(ACTIVATIONS)}")
        self.linear = nn.Linear(in_features, out_features, bias=use_bias)
        self.activation = activation

    @classmethod
    def from_keras_layer(cls, layer: Any) -> "Dense":
        if not is_layer_class(layer, "Dense"):
            raise MigrationError(f"Dense twin needs a keras Dense layer, stage {layer.name!r} "
                                 f"is a {type(layer).__name__}")
        kernel = _weight(layer.kernel)
        twin = cls(kernel.shape[0], kernel.shape[1], activation_name(layer), layer.use_bias)
        with torch.no_grad():
            twin.linear.weight.copy_(kernel.T)
            if layer.use_bias:
                twin.linear.bias.copy_(_weight(layer.bias))
        return twin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ACTIVATIONS[self.activation](self.linear(x))


class Embedding(nn.Module):
    """``keras.layers.Embedding``: ids ``[...]`` int -> ``[..., dim]`` float32. With
    ``mask_zero`` it also returns the Keras mask ``ids != 0`` (``returns_mask``), so the
    padding mask travels on to the next stages."""

    def __init__(self, table: torch.Tensor, mask_zero: bool = False):
        super().__init__()
        self.table = nn.Embedding.from_pretrained(table, freeze=False)
        self.returns_mask = mask_zero

    @classmethod
    def from_keras_layer(cls, layer: Any) -> "Embedding":
        if not is_layer_class(layer, "Embedding"):
            raise MigrationError(f"Embedding twin needs a keras Embedding layer, stage "
                                 f"{layer.name!r} is a {type(layer).__name__}")
        return cls(_weight(layer.embeddings), bool(getattr(layer, "mask_zero", False)))

    def forward(self, ids: torch.Tensor):
        out = self.table(ids.long())
        return (out, ids != 0) if self.returns_mask else out


class LayerNormalization(nn.Module):
    """``keras.layers.LayerNormalization`` over the last axis; x ``[..., dim]`` float32."""

    def __init__(self, gamma: torch.Tensor, beta: torch.Tensor, epsilon: float):
        super().__init__()
        self.norm = nn.LayerNorm(gamma.shape[0], eps=epsilon)
        with torch.no_grad():
            self.norm.weight.copy_(gamma)
            self.norm.bias.copy_(beta)

    @classmethod
    def from_keras_layer(cls, layer: Any) -> "LayerNormalization":
        if not is_layer_class(layer, "LayerNormalization") or \
                list(layer.axis) not in ([-1], [len(layer.input.shape) - 1]):
            raise MigrationError(f"LayerNormalization twin needs a keras LayerNormalization "
                                 f"over the last axis, stage {layer.name!r} is not one")
        return cls(_weight(layer.gamma), _weight(layer.beta), float(layer.epsilon))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)
