"""Recommendation models written in Keras 3, used as plan factories (``ctr_keras3:fm``, ...).

* ``fm``: a factorization machine: field ids [B, F] and dense features [B, 3] -> CTR [B, 1].
* ``multi_tower``: user ids [B, 3] and item ids [B, 2] through one shared id embedding
  (stages ``id_embedding`` and ``id_embedding#1``), pooled, projected, scored by a dot product.
* ``attention_history``: attention pooling of a user's item history (ids [B, T], 0 pads, T may
  vary per batch) against a target item, with Keras masks from ``mask_zero=True``; the item
  embedding is shared by history and target (stages ``item_embedding`` and
  ``item_embedding#1``).

``ctr_tf_keras`` holds the same architectures in tf_keras (Keras 2).
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

FIELDS, VOCAB, DIM, DENSE = 4, 50, 8, 3
ITEMS, HISTORY = 40, 6


class FirstOrder(keras.layers.Layer):
    """Sum of the per-field biases: [B, F, 1] -> [B, 1]."""

    def call(self, weights):
        return ops.sum(weights, axis=1)


class FMInteraction(keras.layers.Layer):
    """Pairwise interactions 0.5 * sum_k((sum_f v)^2 - sum_f v^2): [B, F, D] -> [B, 1]."""

    def call(self, v):
        square_of_sum = ops.square(ops.sum(v, axis=1))
        sum_of_square = ops.sum(ops.square(v), axis=1)
        return 0.5 * ops.sum(square_of_sum - sum_of_square, axis=1, keepdims=True)


def fm() -> keras.Model:
    keras.utils.set_random_seed(11)
    fields = keras.Input((FIELDS,), dtype="int32", name="fields")
    dense = keras.Input((DENSE,), name="dense")
    embedded = keras.layers.Embedding(VOCAB, DIM, name="field_embedding")(fields)
    bias = keras.layers.Embedding(VOCAB, 1, name="field_bias")(fields)
    first = FirstOrder(name="first_order")(bias)
    pairs = FMInteraction(name="fm_interaction")(embedded)
    linear = keras.layers.Dense(1, name="dense_linear")(dense)
    logit = keras.layers.Add(name="logit")([first, pairs, linear])
    ctr = keras.layers.Activation("sigmoid", name="ctr")(logit)
    return keras.Model([fields, dense], ctr, name="fm")


class AttentionPooling(keras.layers.Layer):
    """DIN-style pooling: keys [B, T, D] (masked), query [B, 1, D] -> [B, D]. Scores come from
    an MLP over [k, q, k*q, k-q]; padded positions get no weight."""

    def __init__(self, units: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.score = keras.layers.Dense(1)

    def build(self, input_shape):
        dim = input_shape[0][-1]
        self.hidden.build((None, None, 4 * dim))
        self.score.build((None, None, self.units))

    def call(self, inputs, mask=None):
        keys, query = inputs
        query = ops.broadcast_to(query, ops.shape(keys))
        features = ops.concatenate([keys, query, keys * query, keys - query], axis=-1)
        scores = ops.squeeze(self.score(self.hidden(features)), axis=-1)
        if mask is not None and mask[0] is not None:
            scores = ops.where(mask[0], scores, -1e9)
        weights = ops.softmax(scores, axis=-1)
        return ops.sum(ops.expand_dims(weights, -1) * keys, axis=1)

    def compute_mask(self, inputs, mask=None):
        return None


class TargetVector(keras.layers.Layer):
    """The target item's embedding [B, 1, D] -> [B, D]; its mask ends here."""

    def call(self, x, mask=None):
        return ops.squeeze(x, axis=1)

    def compute_mask(self, inputs, mask=None):
        return None


def attention_history() -> keras.Model:
    keras.utils.set_random_seed(12)
    history = keras.Input((None,), dtype="int32", name="history")
    target = keras.Input((1,), dtype="int32", name="target")
    user = keras.Input((DENSE,), name="user")
    items = keras.layers.Embedding(ITEMS, DIM, mask_zero=True, name="item_embedding")
    keys, query = items(history), items(target)
    pooled = AttentionPooling(16, name="attention_pooling")([keys, query])
    target_vector = TargetVector(name="target_vector")(query)
    features = keras.layers.Concatenate(name="features")([pooled, target_vector, user])
    hidden = keras.layers.Dense(32, activation="relu", name="mlp")(features)
    ctr = keras.layers.Dense(1, activation="sigmoid", name="ctr")(hidden)
    return keras.Model([history, target, user], ctr, name="attention_history")


class MeanPool(keras.layers.Layer):
    """Mean over the id axis: [B, N, D] -> [B, D]."""

    def call(self, x):
        return ops.mean(x, axis=1)


def multi_tower() -> keras.Model:
    keras.utils.set_random_seed(13)
    user_ids = keras.Input((3,), dtype="int32", name="user_ids")
    item_ids = keras.Input((2,), dtype="int32", name="item_ids")
    ids = keras.layers.Embedding(VOCAB, DIM, name="id_embedding")
    user = MeanPool(name="user_pool")(ids(user_ids))
    item = MeanPool(name="item_pool")(ids(item_ids))
    user = keras.layers.Dense(DIM, activation="tanh", name="user_tower")(user)
    item = keras.layers.Dense(DIM, activation="tanh", name="item_tower")(item)
    score = keras.layers.Dot(axes=1, name="score")([user, item])
    return keras.Model([user_ids, item_ids], score, name="multi_tower")


def fm_batches(count: int = 2, rows: int = 5, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"fields": rng.integers(0, VOCAB, (rows, FIELDS)).astype(np.int32),
             "dense": rng.normal(size=(rows, DENSE)).astype(np.float32)} for _ in range(count)]


def history_batches(count: int = 2, rows: int = 5, seed: int = 0,
                    lengths: tuple[int, ...] = (HISTORY,)) -> list[dict[str, np.ndarray]]:
    """Batches padded to ``lengths[i % len(lengths)]`` positions; each row keeps >= 1 item."""
    rng = np.random.default_rng(seed)
    batches = []
    for i in range(count):
        length = lengths[i % len(lengths)]
        ids = rng.integers(1, ITEMS, (rows, length)).astype(np.int32)
        keep = np.arange(length)[None, :] < rng.integers(1, length + 1, (rows, 1))
        batches.append({"history": np.where(keep, ids, 0).astype(np.int32),
                        "target": rng.integers(1, ITEMS, (rows, 1)).astype(np.int32),
                        "user": rng.normal(size=(rows, DENSE)).astype(np.float32)})
    return batches
