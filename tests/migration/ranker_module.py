"""A ranker written as a plain ``tf.Module`` (no Keras), as teams export them: ragged item
histories pooled with segment ops, a dense scoring tower. Wrapped one stage per function with
:class:`bridge.migration.saved_model.FunctionStage`."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

DIM, DENSE, VOCAB = 4, 3, 30


class RankerModule(tf.Module):
    def __init__(self, seed: int = 41):
        super().__init__(name="ranker")
        rng = np.random.default_rng(seed)
        self.table = tf.Variable(rng.normal(size=(VOCAB, DIM)).astype(np.float32))
        self.kernel = tf.Variable(rng.normal(size=(DIM + DENSE, 1)).astype(np.float32))
        self.bias = tf.Variable(np.float32(0.1))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64, name="item_ids"),
                                  tf.TensorSpec([None], tf.int64, name="row_splits")])
    def pool(self, item_ids, row_splits):
        """Ragged history (flat ids + row_splits) -> mean embedding per row [B, DIM]."""
        segments = tf.ragged.row_splits_to_segment_ids(row_splits)
        rows = tf.shape(row_splits)[0] - 1
        summed = tf.math.unsorted_segment_sum(tf.gather(self.table, item_ids), segments, rows)
        counts = tf.cast(row_splits[1:] - row_splits[:-1], tf.float32)
        return summed / tf.maximum(counts, 1.0)[:, None]

    @tf.function(input_signature=[tf.TensorSpec([None, DIM], tf.float32, name="pooled"),
                                  tf.TensorSpec([None, DENSE], tf.float32, name="dense")])
    def score(self, pooled, dense):
        logits = tf.matmul(tf.concat([pooled, dense], -1), self.kernel) + self.bias
        return {"probability": tf.sigmoid(logits), "logit": logits}


def wrap(ranker) -> "keras.Model":
    """One stage per function of ``ranker`` (a RankerModule or its loaded SavedModel)."""
    import keras

    from bridge.migration.saved_model import FunctionStage

    item_ids = keras.Input((), dtype="int64", name="item_ids")
    row_splits = keras.Input((), dtype="int64", name="row_splits")
    dense = keras.Input((DENSE,), name="dense")
    pooled = FunctionStage(ranker.pool, name="pool")(item_ids, row_splits)
    logit, probability = FunctionStage(ranker.score, name="score")(pooled, dense)
    model = keras.Model([item_ids, row_splits, dense], [probability, logit], name="ranker")
    model._module = ranker   # keeps the module's variables alive with the model
    return model


def module_ranker():
    return wrap(RankerModule())


def ranker_batches(count: int = 2, rows: int = 4, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(count):
        lengths = rng.integers(1, 5, rows)
        splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        batches.append({"item_ids": rng.integers(0, VOCAB, int(splits[-1])).astype(np.int64),
                        "row_splits": splits,
                        "dense": rng.normal(size=(rows, DENSE)).astype(np.float32)})
    return batches
