"""Small Keras Functional models with named stages, used as plan factories by the tests."""

from __future__ import annotations

import keras
import numpy as np
import torch
from torch import nn

FEATURES = 6
VOCAB = 10


def mlp() -> keras.Model:
    """x [B, 6] float32 -> hidden (silu) -> norm -> head (tanh) [B, 3]."""
    keras.utils.set_random_seed(1)
    x = keras.Input((FEATURES,), name="x")
    h = keras.layers.Dense(16, activation="silu", name="hidden")(x)
    h = keras.layers.LayerNormalization(name="norm")(h)
    h = keras.layers.Dense(8, activation="relu", name="middle")(h)
    out = keras.layers.Dense(3, activation="tanh", name="head",
                             bias_initializer="random_normal")(h)
    return keras.Model(x, out, name="toy_mlp")


def embedding_dense() -> keras.Model:
    """ids [B, 4] int32 -> embedding -> mean over ids -> dense (gelu, tanh approx) [B, 5]."""
    keras.utils.set_random_seed(2)
    ids = keras.Input((4,), dtype="int32", name="ids")
    e = keras.layers.Embedding(VOCAB, 8, name="embed")(ids)
    pooled = keras.layers.GlobalAveragePooling1D(name="pool")(e)
    act = lambda t: keras.activations.gelu(t, approximate=True)  # noqa: E731
    out = keras.layers.Dense(5, activation=act, name="proj")(pooled)
    return keras.Model(ids, out, name="toy_embed")


class Bucketize(keras.layers.Layer):
    """tf.searchsorted over fixed boundaries: not in any known-layer table, so only tf2onnx's
    raw-op output reveals that it cannot convert."""

    def call(self, x):
        import tensorflow as tf
        edges = tf.constant([[-1.0, 0.0, 1.0]])
        return tf.searchsorted(tf.tile(edges, [tf.shape(x)[0], 1]), x)


def with_unconvertible() -> keras.Model:
    """A string lookup, an integer lookup, hashing, searchsorted and exact gelu beside two
    convertible stages."""
    keras.utils.set_random_seed(3)
    country = keras.Input((1,), dtype="string", name="country")
    user = keras.Input((1,), dtype="int64", name="user")
    x = keras.Input((FEATURES,), name="x")
    c = keras.layers.StringLookup(vocabulary=["us", "gb", "de"], name="country_lookup")(country)
    u = keras.layers.IntegerLookup(vocabulary=[7, 11, 13], name="user_lookup")(user)
    h = keras.layers.Hashing(num_bins=16, name="user_hash")(user)
    d = keras.layers.Dense(4, activation="gelu", name="exact_gelu")(x)
    ok = keras.layers.Dense(4, activation="relu", name="dense_ok")(x)
    buckets = Bucketize(name="bucketize")(x)
    ids = keras.layers.Concatenate(name="ids")([c, u, h])
    return keras.Model([country, user, x], [ids, d, ok, buckets], name="toy_mixed")


def mlp_batches(count: int = 3, rows: int = 5, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(rows, FEATURES)).astype(np.float32)} for _ in range(count)]


class BrokenDense(nn.Module):
    """A Torch twin of a Dense layer with a bug: the bias is added twice."""

    def __init__(self, linear: nn.Linear, activation):
        super().__init__()
        self.linear, self.activation = linear, activation

    @classmethod
    def from_keras_layer(cls, layer) -> "BrokenDense":
        from bridge.migration.keras_twins import Dense
        twin = Dense.from_keras_layer(layer)
        with torch.no_grad():
            twin.linear.bias.add_(0.05)
        return cls(twin.linear, twin.activation)

    def forward(self, x):
        from bridge.migration.keras_twins import ACTIVATIONS
        return ACTIVATIONS[self.activation](self.linear(x) + self.linear.bias)
