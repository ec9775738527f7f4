"""Keras 3 stages built from the ops of CTR and sequence models: ragged pooling through
segment sums, segment means, a sparse embedding lookup, masked attention pooling, top-k and
unique ids. ``pooling_ops`` puts them in one Functional model (factory
``sequence_ops_models:pooling_ops``)."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

DIM, VOCAB = 4, 20


class RaggedSumPooling(keras.layers.Layer):
    """Ragged rows given as values [N, D] + row_splits [B + 1] -> per-row sums [B, D]."""

    def call(self, values, row_splits):
        segments = tf.ragged.row_splits_to_segment_ids(row_splits)
        return tf.math.unsorted_segment_sum(values, segments, tf.shape(row_splits)[0] - 1)


class SegmentMeanPooling(keras.layers.Layer):
    """The same rows averaged (rows must be non-empty): [N, D], [B + 1] -> [B, D]."""

    def call(self, values, row_splits):
        return tf.math.segment_mean(values, tf.ragged.row_splits_to_segment_ids(row_splits))


class SparseEmbeddingMean(keras.layers.Layer):
    """Multi-hot ids [B, L] (-1: no id) -> mean of their embeddings [B, D], through
    ``tf.nn.embedding_lookup_sparse`` as sparse-feature CTR models look them up."""

    def build(self, input_shape):
        self.table = self.add_weight(shape=(VOCAB, DIM), initializer="random_normal",
                                     name="table")

    def call(self, ids):
        shifted = tf.sparse.from_dense(ids + 1)   # 0 marks "no id"
        sparse = tf.SparseTensor(shifted.indices, shifted.values - 1, shifted.dense_shape)
        return tf.nn.embedding_lookup_sparse(tf.convert_to_tensor(self.table), sparse, None,
                                             combiner="mean")

    def compute_output_shape(self, input_shape):
        return (input_shape[0], DIM)


class MaskedAttentionPooling(keras.layers.Layer):
    """Softmax attention of a learned query over keys [B, T, D] where mask [B, T] is true."""

    def build(self, input_shape):
        self.query = self.add_weight(shape=(DIM,), initializer="random_normal", name="query")

    def call(self, keys, mask):
        scores = tf.where(mask, tf.linalg.matvec(keys, tf.convert_to_tensor(self.query)), -1e9)
        return tf.reduce_sum(tf.nn.softmax(scores)[..., None] * keys, axis=1)


class TopItems(keras.layers.Layer):
    """Indices of the 2 best scores per row: [B, K] -> int32 [B, 2]."""

    def call(self, scores):
        return tf.math.top_k(scores, k=2).indices


class DistinctIds(keras.layers.Layer):
    """The distinct ids of a flat id list in first-seen order: [N] -> [U] (data-dependent)."""

    def call(self, ids):
        return tf.unique(ids).y


class RowSplitsFromLengths(keras.layers.Layer):
    """Row lengths [B] -> row_splits [B + 1] (a ragged feature's offsets)."""

    def call(self, lengths):
        return tf.pad(tf.cumsum(lengths), [[1, 0]])


class TwoCosines(keras.layers.Layer):
    """cos(x) + cos(2x): two nodes of an op without a Torch converter."""

    def call(self, x):
        return tf.cos(x) + tf.cos(2.0 * x)


def pooling_ops() -> keras.Model:
    keras.utils.set_random_seed(31)
    values = keras.Input((DIM,), name="values")
    row_splits = keras.Input((), dtype="int64", name="row_splits")
    ids = keras.Input((3,), dtype="int64", name="multi_hot")
    keys = keras.Input((None, DIM), name="keys")
    mask = keras.Input((None,), dtype="bool", name="key_mask")
    scores = keras.Input((5,), name="scores")
    flat_ids = keras.Input((), dtype="int64", name="flat_ids")
    lengths = keras.Input((), dtype="int64", name="row_lengths")
    outputs = [RaggedSumPooling(name="ragged_sum")(values, row_splits),
               SegmentMeanPooling(name="segment_mean")(values, row_splits),
               SparseEmbeddingMean(name="sparse_lookup")(ids),
               MaskedAttentionPooling(name="masked_attention")(keys, mask),
               TopItems(name="top_items")(scores),
               DistinctIds(name="distinct_ids")(flat_ids),
               RowSplitsFromLengths(name="row_splits_from_lengths")(lengths),
               TwoCosines(name="two_cosines")(scores)]
    return keras.Model([values, row_splits, ids, keys, mask, scores, flat_ids, lengths], outputs,
                       name="pooling_ops")


def pooling_batch(rows: int = 3, length: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 4, rows)
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    multi_hot = rng.integers(0, VOCAB, (rows, 3))
    multi_hot[rng.random((rows, 3)) < 0.3] = -1
    multi_hot[:, 0] = rng.integers(0, VOCAB, rows)          # every row has an id
    mask = np.arange(length)[None, :] < rng.integers(1, length + 1, (rows, 1))
    return {"values": rng.normal(size=(int(splits[-1]), DIM)).astype(np.float32),
            "row_splits": splits, "multi_hot": multi_hot.astype(np.int64),
            "keys": rng.normal(size=(rows, length, DIM)).astype(np.float32), "key_mask": mask,
            "scores": rng.normal(size=(rows, 5)).astype(np.float32),
            "flat_ids": rng.integers(0, 6, 8).astype(np.int64), "row_lengths": lengths}


def distinct_ids() -> keras.Model:
    """flat ids [N] -> their distinct values [U]: an output size that depends on the data."""
    ids = keras.Input((), dtype="int64", name="flat_ids")
    return keras.Model(ids, DistinctIds(name="distinct_ids")(ids), name="distinct_ids")


class PositiveValues(keras.layers.Layer):
    """The positive entries of a score list and where they are: [N] -> ([P], int64 [P, 1])."""

    def call(self, scores):
        return tf.boolean_mask(scores, scores > 0), tf.where(scores > 0)


def positive_values() -> keras.Model:
    """scores [N] -> the positive ones [P] and their positions [P, 1] (data-dependent sizes)."""
    scores = keras.Input((), name="scores")
    values, where = PositiveValues(name="positive_values")(scores)
    return keras.Model(scores, [values, where], name="positive_values")
