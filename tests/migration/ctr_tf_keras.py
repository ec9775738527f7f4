"""The recommendation models of ``ctr_keras3`` written against ``tf.keras`` as Keras 2 code is
(custom layers in TF ops), plus a subclassed ranker with stages. Build them only in a process
started with ``TF_USE_LEGACY_KERAS=1``: there ``tf.keras`` is tf_keras.

* ``fm``, ``attention_history``: as in ``ctr_keras3`` (same names, shapes and stages).
* ``multi_tower``: a subclassed ``tf.keras.Model`` whose user and item towers share one id
  embedding; ``stage(name)`` / ``replace_stage(name, layer)`` expose its layers as stages.
"""

from __future__ import annotations

import tensorflow as tf

from ctr_keras3 import DENSE, DIM, FIELDS, ITEMS, VOCAB, fm_batches, history_batches  # noqa: F401
from ctr_tf_keras_batches import multi_tower_batches

keras = tf.keras


class FirstOrder(keras.layers.Layer):
    """Sum of the per-field biases: [B, F, 1] -> [B, 1]."""

    def call(self, weights):
        return tf.reduce_sum(weights, axis=1)


class FMInteraction(keras.layers.Layer):
    """Pairwise interactions 0.5 * sum_k((sum_f v)^2 - sum_f v^2): [B, F, D] -> [B, 1]."""

    def call(self, v):
        square_of_sum = tf.square(tf.reduce_sum(v, axis=1))
        sum_of_square = tf.reduce_sum(tf.square(v), axis=1)
        return 0.5 * tf.reduce_sum(square_of_sum - sum_of_square, axis=1, keepdims=True)


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
    """DIN-style pooling: keys [B, T, D] (masked), query [B, 1, D] -> [B, D]."""

    def __init__(self, units: int = 16, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.score = keras.layers.Dense(1)
        self.supports_masking = True

    def call(self, inputs, mask=None):
        keys, query = inputs
        query = tf.broadcast_to(query, tf.shape(keys))
        features = tf.concat([keys, query, keys * query, keys - query], axis=-1)
        scores = tf.squeeze(self.score(self.hidden(features)), axis=-1)
        if mask is not None and mask[0] is not None:
            scores = tf.where(mask[0], scores, -1e9)
        weights = tf.nn.softmax(scores, axis=-1)
        return tf.reduce_sum(weights[..., None] * keys, axis=1)

    def compute_mask(self, inputs, mask=None):
        return None


class TargetVector(keras.layers.Layer):
    """The target item's embedding [B, 1, D] -> [B, D]; its mask ends here."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, x, mask=None):
        return tf.squeeze(x, axis=1)

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
        return tf.reduce_mean(x, axis=1)


class MultiTower(keras.Model):
    """Two-tower ranker: user ids [B, U] and item ids [B, I] share ``id_embedding``; each tower
    pools and projects; the score is the dot product [B, 1]."""

    STAGES = ("id_embedding", "user_pool", "item_pool", "user_tower", "item_tower", "score")

    def __init__(self):
        super().__init__(name="multi_tower")
        keras.utils.set_random_seed(13)
        self._stages = {
            "id_embedding": keras.layers.Embedding(VOCAB, DIM, name="id_embedding"),
            "user_pool": MeanPool(name="user_pool"),
            "item_pool": MeanPool(name="item_pool"),
            "user_tower": keras.layers.Dense(DIM, activation="tanh", name="user_tower"),
            "item_tower": keras.layers.Dense(DIM, activation="tanh", name="item_tower"),
            "score": keras.layers.Dot(axes=1, name="score"),
        }
        self._calls = dict(self._stages)   # what call() runs; replace_stage swaps entries
        for name, layer in self._stages.items():
            setattr(self, f"layer_{name}", layer)   # tracked, so weights belong to the model

    def stage(self, name: str):
        return self._stages[name]

    def replace_stage(self, name: str, layer) -> None:
        self._calls[name] = layer

    def call(self, inputs):
        c = self._calls
        user = c["user_tower"](c["user_pool"](c["id_embedding"](inputs["user_ids"])))
        item = c["item_tower"](c["item_pool"](c["id_embedding"](inputs["item_ids"])))
        return {"score": c["score"]([user, item])}


def multi_tower() -> keras.Model:
    model = MultiTower()
    model(multi_tower_batches(1)[0])   # builds the weights
    return model
