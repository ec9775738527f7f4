"""Keras 3 models for the dynamic-shape and failure tests (plan factories ``shape_models:...``)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

HISTORY, ITEMS, DIM = 6, 20, 4


class PositionDecay(keras.layers.Layer):
    """Weights history position p by 0.9**p, with the weights made in numpy from the static
    length: it converts only at a fixed length. ids [B, T] -> weights [B, T] float32."""

    def call(self, ids):
        decay = np.power(0.9, np.arange(ids.shape[1])).astype(np.float32)
        return tf.cast(ids > 0, tf.float32) * decay

    def compute_output_shape(self, input_shape):
        return input_shape


class PositiveIdsOnly(keras.layers.Layer):
    """Refuses id 0 eagerly (a data check): random samples of ids in {0, 1} fail it."""

    def call(self, ids):
        tf.debugging.assert_positive(ids, message="ids must be positive")
        return ids


class TracesBadly(keras.layers.Layer):
    """Fails only when traced, with a message whose cause is on its second line."""

    def call(self, x):
        if not tf.executing_eagerly():
            raise ValueError("tracing refused\nthe real cause: a Python-side check")
        return x

    def compute_output_shape(self, input_shape):
        return input_shape


def decayed_history() -> keras.Model:
    """history ids [B, T] (T varies per batch) -> decay-weighted mean embedding [B, 4]."""
    keras.utils.set_random_seed(21)
    history = keras.Input((None,), dtype="int32", name="history")
    embedded = keras.layers.Embedding(ITEMS, DIM, name="item_embedding")(history)
    weights = PositionDecay(name="position_decay")(history)
    pooled = keras.layers.Dot(axes=(1, 1), name="weighted_sum")([weights, embedded])
    return keras.Model(history, pooled, name="decayed_history")


def checked_ids() -> keras.Model:
    """A stage that cannot be sampled randomly, a stage that fails tracing, and one that
    converts."""
    keras.utils.set_random_seed(22)
    ids = keras.Input((3,), dtype="int32", name="ids")
    x = keras.Input((DIM,), name="x")
    checked = PositiveIdsOnly(name="positive_ids")(ids)
    traced = TracesBadly(name="traces_badly")(x)
    dense = keras.layers.Dense(2, name="dense")(x)
    return keras.Model([ids, x], [checked, traced, dense], name="checked_ids")


def history_batches(lengths: tuple[int, ...], rows: int = 5, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"history": rng.integers(0, ITEMS, (rows, n)).astype(np.int32)} for n in lengths]
