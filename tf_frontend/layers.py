"""Keras layers over the project's C++ feature ops, and the small Keras stages around them.

Each layer is one named stage of ``tf_frontend.feature_graph.FeatureGraph``: its ``call`` takes
and returns plain tensors (no dicts), matching the op's contract in ``custom_ops.registry``, so
the migration toolkit can replace a stage by a Torch layer with the same signature.
"""

from __future__ import annotations

import keras
import tensorflow as tf

import custom_ops
from xgr_common.errors import ConfigError, require
from xgr_common.layout import TokenLayout
from xgr_common.prompt_v2 import HistorySplit, PromptV2Layout


class XgrCleanSequence(keras.layers.Layer):
    """``custom_ops.clean_sequence`` as a layer: window filter, duplicate collapse, keep last N.

    call(values int64 [E], timestamps int64 [E], row_splits int64 [B+1], request_time int64 [B])
    -> (values int64 [E'], timestamps int64 [E'], row_splits int64 [B+1]).
    """

    def __init__(self, window_seconds: int, keep_last: int, **kwargs):
        super().__init__(**kwargs)
        require(window_seconds > 0, ConfigError,
                f"window_seconds must be > 0, got {window_seconds}")
        require(keep_last >= 1, ConfigError, f"keep_last must be >= 1, got {keep_last}")
        self.window_seconds = int(window_seconds)
        self.keep_last = int(keep_last)

    def call(self, values, timestamps, row_splits, request_time):
        return tuple(custom_ops.clean_sequence(values, timestamps, row_splits, request_time,
                                               window_seconds=self.window_seconds,
                                               keep_last=self.keep_last))

    def get_config(self) -> dict:
        return {**super().get_config(), "window_seconds": self.window_seconds,
                "keep_last": self.keep_last}


class XgrSemanticIdLookup(keras.layers.Layer):
    """``custom_ops.semantic_id_lookup`` over a ``SemanticIdTable`` (a SavedModel asset).

    call(items int64 [E], row_splits int64 [B+1])
    -> (code_tokens int64 [E', levels], row_splits int64 [B+1], unknown_count int64 [B]);
    unknown items are dropped from the rows and counted.
    """

    def __init__(self, table: custom_ops.SemanticIdTable, code_base: int, **kwargs):
        super().__init__(**kwargs)
        self.table = table  # tracked: a SavedModel carries the table and its catalog asset
        self.code_base = int(code_base)

    def call(self, items, row_splits):
        return tuple(self.table.lookup(items, row_splits, code_base=self.code_base))


class XgrAssemblePrompt(keras.layers.Layer):
    """``custom_ops.assemble_prompt``: the engine's right-padded prompt with segment ids.

    call(context_tokens int64 [B, P], item_tokens int64 [E', levels], item_row_splits int64
    [B+1]) -> (token_ids int32 [B, L], lengths int32 [B], segment_ids int32 [B, L]), with
    L = ``max_length`` (rows too long drop their oldest items).
    """

    def __init__(self, layout: TokenLayout, max_length: int, **kwargs):
        super().__init__(**kwargs)
        require(max_length >= 4, ConfigError, f"max_length must be >= 4, got {max_length}")
        self.layout = layout
        self.max_length = int(max_length)

    def call(self, context_tokens, item_tokens, item_row_splits):
        layout = self.layout
        return tuple(custom_ops.assemble_prompt(
            context_tokens, item_tokens, item_row_splits, bos_id=layout.bos_id,
            profile_start_id=layout.profile_start_id, item_start_id=layout.item_start_id,
            pad_id=layout.pad_id, max_length=self.max_length))


class XgrSplitHistory(keras.layers.Layer):
    """``custom_ops.split_history`` as a layer: the version 2 prompt's long-term part (whole
    closed time blocks, frozen while a block is open) and its recent part.

    call(values int64 [E], timestamps int64 [E], row_splits int64 [B+1], request_time int64
    [B]) -> (long_values, long_row_splits, recent_values, recent_row_splits), all int64.
    """

    def __init__(self, split: HistorySplit, **kwargs):
        super().__init__(**kwargs)
        require(isinstance(split, HistorySplit), ConfigError,
                f"split must be a HistorySplit, got {type(split).__name__}")
        self.split = split

    def call(self, values, timestamps, row_splits, request_time):
        return tuple(custom_ops.split_history(values, timestamps, row_splits, request_time,
                                              **self.split.as_attrs()))

    def get_config(self) -> dict:
        return {**super().get_config(), **self.split.as_attrs()}


class XgrAssemblePromptV2(keras.layers.Layer):
    """``custom_ops.assemble_prompt_v2``: the version 2 prompt (``xgr_common.prompt_v2``),
    every row ``max_length`` long (a longer row is refused, never cut).

    call(long_item_tokens int64 [E1, levels], long_row_splits int64 [B+1], context_tokens
    int64 [B, P], recent_item_tokens int64 [E2, levels], recent_row_splits int64 [B+1])
    -> (token_ids int32 [B, L], lengths int32 [B], segment_ids int32 [B, L],
    frozen_lengths int32 [B]).
    """

    def __init__(self, layout: TokenLayout, prompt: PromptV2Layout, soft_tokens: int,
                 max_length: int, **kwargs):
        super().__init__(**kwargs)
        require(soft_tokens >= 0 and max_length >= 1, ConfigError,
                f"soft_tokens must be >= 0 and max_length >= 1, got {soft_tokens} and "
                f"{max_length}")
        self.layout, self.prompt = layout, prompt
        self.soft_tokens, self.max_length = int(soft_tokens), int(max_length)

    def call(self, long_item_tokens, long_row_splits, context_tokens, recent_item_tokens,
             recent_row_splits):
        layout = self.layout
        return tuple(custom_ops.assemble_prompt_v2(
            long_item_tokens, long_row_splits, context_tokens, recent_item_tokens,
            recent_row_splits, bos_id=layout.bos_id, profile_start_id=layout.profile_start_id,
            item_start_id=layout.item_start_id, soft_id=layout.soft_id, pad_id=layout.pad_id,
            soft_tokens=self.soft_tokens, max_length=self.max_length,
            **self.prompt.spans.as_attrs()))


class HashProfileIds(keras.layers.Layer):
    """Hashes each request's user id and country into one table's buckets (Keras ``Hashing``).

    call(user_id int64 [B], country string [B]) -> profile_ids int64 [B, 2]
    = [user bucket, country bucket], each in [0, buckets). The user id is hashed through its
    decimal string, so ids and strings share one hash function (FarmHash fingerprint64, TF's
    ``StringToHashBucketFast``).
    """

    def __init__(self, buckets: int, **kwargs):
        super().__init__(**kwargs)
        require(buckets >= 1, ConfigError, f"buckets must be >= 1, got {buckets}")
        self.buckets = int(buckets)
        self.hashing = keras.layers.Hashing(num_bins=self.buckets, name="hashing")

    def call(self, user_id, country):
        keys = tf.stack([tf.strings.as_string(user_id), country], axis=1)
        return tf.cast(self.hashing(keys), tf.int64)

    def get_config(self) -> dict:
        return {**super().get_config(), "buckets": self.buckets}
