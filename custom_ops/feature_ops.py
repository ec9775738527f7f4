"""Python wrappers of the C++ feature ops (library ``custom_ops._feature_ops``).

Each wrapper converts integer inputs to int64, calls the op and names its outputs. The ops
validate everything else themselves and raise ``tf.errors.InvalidArgumentError`` naming the
input and the rule. The Torch twins (``custom_ops.torch_twins``) implement the same semantics.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from custom_ops._loader import load_library
from xgr_common.errors import InvalidInputError


INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
MAX_PROMPT_LENGTH = 2**20  # the assemble op's bound on max_length
_WIDENABLE = (tf.int8, tf.int16, tf.int32, tf.int64, tf.uint8, tf.uint16, tf.uint32)


class CleanedSequence(NamedTuple):
    values: tf.Tensor       # int64 [E']
    timestamps: tf.Tensor   # int64 [E']
    row_splits: tf.Tensor   # int64 [B+1]


class PromptV2(NamedTuple):
    token_ids: tf.Tensor       # int32 [B, L]
    lengths: tf.Tensor         # int32 [B]
    segment_ids: tf.Tensor     # int32 [B, L]
    frozen_lengths: tf.Tensor  # int32 [B]


class SplitHistory(NamedTuple):
    long_values: tf.Tensor         # int64 [E_long]
    long_row_splits: tf.Tensor     # int64 [B+1]
    recent_values: tf.Tensor       # int64 [E_recent]
    recent_row_splits: tf.Tensor   # int64 [B+1]


class CodeTokens(NamedTuple):
    code_tokens: tf.Tensor    # int64 [E', levels]
    row_splits: tf.Tensor     # int64 [B+1]
    unknown_count: tf.Tensor  # int64 [B]


class Prompt(NamedTuple):
    token_ids: tf.Tensor    # int32 [B, L]
    lengths: tf.Tensor      # int32 [B]
    segment_ids: tf.Tensor  # int32 [B, L]


def as_int64(value, name: str) -> tf.Tensor:
    """``value`` as an int64 tensor; integer dtypes that fit are widened, anything else
    (floats, uint64, Python ints beyond int64) is refused with ``InvalidInputError``."""
    try:
        tensor = tf.convert_to_tensor(value)
    except (ValueError, TypeError, OverflowError) as err:
        raise InvalidInputError(f"{name} cannot become an int64 tensor: {err}") from err
    if tensor.dtype not in _WIDENABLE:
        raise InvalidInputError(f"{name} must be an integer tensor that fits int64, got dtype "
                                f"{tensor.dtype.name}")
    return tf.cast(tensor, tf.int64)


def int_attr(value, name: str, lo: int, hi: int) -> int:
    """A Python int attribute in [lo, hi]; checked here because TF's Python layer cannot even
    pass values beyond int64 to the op, and says so unclearly."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise InvalidInputError(f"attribute {name} must be an int, got {type(value).__name__}")
    if not lo <= int(value) <= hi:
        raise InvalidInputError(f"attribute {name} must lie in [{lo}, {hi}], got {value}")
    return int(value)


def clean_sequence(values, timestamps, row_splits, request_time, *, window_seconds: int,
                   keep_last: int) -> CleanedSequence:
    """Cleans ragged behaviour sequences (``XgrCleanSequence``).

    Args:
      values: int64 [E], event values (item ids), the rows concatenated.
      timestamps: int64 [E], event times, non-decreasing inside each row.
      row_splits: int64 [B+1], row b is ``values[row_splits[b]:row_splits[b+1]]``.
      request_time: int64 [B], when each row's request is served.
      window_seconds: > 0; events older than ``request_time - window_seconds`` are dropped.
      keep_last: >= 1; at most this many (the most recent) events survive per row.

    Per row, in order: drop events after ``request_time`` (leakage) or before the window;
    collapse each run of equal consecutive values into one event carrying the run's LAST
    timestamp; keep the last ``keep_last`` events.

    Returns:
      ``CleanedSequence(values int64 [E'], timestamps int64 [E'], row_splits int64 [B+1])``.
    """
    out = load_library("feature_ops").xgr_clean_sequence(
        values=as_int64(values, "values"), timestamps=as_int64(timestamps, "timestamps"),
        row_splits=as_int64(row_splits, "row_splits"),
        request_time=as_int64(request_time, "request_time"),
        window_seconds=int_attr(window_seconds, "window_seconds", 1, INT64_MAX),
        keep_last=int_attr(keep_last, "keep_last", 1, INT64_MAX))
    return CleanedSequence(*out)


def split_history(values, timestamps, row_splits, request_time, *, block_seconds: int,
                  long_term_blocks: int, long_term_items: int,
                  recent_items: int) -> SplitHistory:
    """Splits ragged behaviour sequences into a frozen long-term part and a recent part
    (``XgrSplitHistory``; the prompt contract v2, ``xgr_common.prompt_v2``).

    Args:
      values, timestamps, row_splits, request_time: as for ``clean_sequence``.
      block_seconds: >= 1; time is cut into blocks of this length, and the request's block
        (``floor(request_time / block_seconds)``) is the open one.
      long_term_blocks: >= 1; the closed blocks (the newest) the long-term part draws from.
      long_term_items: >= 0; the most long-term events per row.
      recent_items: >= 1; the most recent events per row.

    Per row: drop events after ``request_time``; collapse each run of equal consecutive values
    inside one block into its last event; the recent part is the open block's newest
    ``recent_items`` events; the long-term part is whole closed blocks from the newest back
    while they fit ``long_term_items`` (the newest alone cut to its newest events). The
    long-term part therefore changes only when the request time enters a new block.

    Returns:
      ``SplitHistory(long_values, long_row_splits, recent_values, recent_row_splits)``.
    """
    out = load_library("feature_ops").xgr_split_history(
        values=as_int64(values, "values"), timestamps=as_int64(timestamps, "timestamps"),
        row_splits=as_int64(row_splits, "row_splits"),
        request_time=as_int64(request_time, "request_time"),
        block_seconds=int_attr(block_seconds, "block_seconds", 1, INT64_MAX),
        long_term_blocks=int_attr(long_term_blocks, "long_term_blocks", 1, 2 ** 40),
        long_term_items=int_attr(long_term_items, "long_term_items", 0, INT64_MAX),
        recent_items=int_attr(recent_items, "recent_items", 1, INT64_MAX))
    return SplitHistory(*out)


def semantic_id_lookup(table, items, row_splits, *, code_base: int) -> CodeTokens:
    """Maps ragged item ids to semantic-ID code tokens (``XgrSemanticIdLookup``).

    Args:
      table: a ``custom_ops.SemanticIdTable``.
      items: int64 [E], item ids, the rows concatenated.
      row_splits: int64 [B+1].
      code_base: first code token id (``xgr_common.layout.TokenLayout.code_base``).

    A known item with code path (c_0, ..., c_{levels-1}) becomes the token row
    ``code_base + l * codebook_size + c_l``; unknown items are dropped and counted.

    Returns:
      ``CodeTokens(code_tokens int64 [E', levels], row_splits int64 [B+1],
      unknown_count int64 [B])``.
    """
    out = load_library("feature_ops").xgr_semantic_id_lookup(
        table=table.resource_handle, items=as_int64(items, "items"),
        row_splits=as_int64(row_splits, "row_splits"),
        code_base=int_attr(code_base, "code_base", 0,
                           INT64_MAX - table.levels * table.codebook_size),
        codebook_size=table.codebook_size, levels=table.levels)
    return CodeTokens(*out)


def assemble_prompt(context_tokens, item_tokens, item_row_splits, *, bos_id: int,
                    profile_start_id: int, item_start_id: int, pad_id: int,
                    max_length: int = 0) -> Prompt:
    """Assembles the engine's right-padded prompts (``XgrAssemblePrompt``).

    Args:
      context_tokens: int64 [B, P], profile/context token ids in [0, 2^31).
      item_tokens: int64 [E', levels], each history item's code tokens, rows concatenated.
      item_row_splits: int64 [B+1], rows of ``item_tokens``.
      bos_id, profile_start_id, item_start_id, pad_id: special token ids (``TokenLayout``).
      max_length: 0 for L = the longest row; otherwise L = ``max_length`` (at most 2^20) and a
        row that is too long drops its OLDEST whole items until it fits (an error if
        3 + P > max_length).

    Row layout (``xgr_common/prompt_spec.py``): ``BOS PROFILE_START ctx_1..ctx_P`` in
    segment 0; the k-th kept item (0-based) as ``ITEM_START c_0..c_{levels-1}`` in segment
    k+1; a trailing ``ITEM_START`` in segment n+1 (the item to generate); then ``pad_id``
    with segment -1.

    Returns:
      ``Prompt(token_ids int32 [B, L], lengths int32 [B], segment_ids int32 [B, L])``.
    """
    out = load_library("feature_ops").xgr_assemble_prompt(
        context_tokens=as_int64(context_tokens, "context_tokens"),
        item_tokens=as_int64(item_tokens, "item_tokens"),
        item_row_splits=as_int64(item_row_splits, "item_row_splits"),
        bos_id=int_attr(bos_id, "bos_id", 0, INT32_MAX),
        profile_start_id=int_attr(profile_start_id, "profile_start_id", 0, INT32_MAX),
        item_start_id=int_attr(item_start_id, "item_start_id", 0, INT32_MAX),
        pad_id=int_attr(pad_id, "pad_id", 0, INT32_MAX),
        max_length=int_attr(max_length, "max_length", 0, MAX_PROMPT_LENGTH))
    return Prompt(*out)


def assemble_prompt_v2(long_item_tokens, long_row_splits, context_tokens, recent_item_tokens,
                       recent_row_splits, *, bos_id: int, profile_start_id: int,
                       item_start_id: int, soft_id: int, pad_id: int, soft_tokens: int,
                       intro=(), before_profile=(), before_recent=(), question=(),
                       max_length: int = 0) -> PromptV2:
    """Assembles v2 prompts (``XgrAssemblePromptV2``; ``xgr_common.prompt_v2``): ``BOS
    intro``, the long-term items (the frozen prefix), the profile block (``before_profile``,
    ``soft_tokens`` SOFT markers, ``PROFILE_START``, the context, ``before_recent``), the
    recent items, ``question`` and the trailing ``ITEM_START``; each item its own segment.

    Args:
      long_item_tokens, recent_item_tokens: int64 [E, levels] code tokens, rows concatenated
        (oldest first); long_row_splits, recent_row_splits: int64 [B+1].
      context_tokens: int64 [B, P].
      intro, before_profile, before_recent, question: text token ids (may be empty).
      max_length: 0 for the longest row; otherwise every row is that long, and a longer row
        is refused (never cut).

    Returns:
      ``PromptV2(token_ids int32 [B, L], lengths int32 [B], segment_ids int32 [B, L],
      frozen_lengths int32 [B])``.
    """
    ids = {name: int_attr(value, name, 0, INT32_MAX) for name, value in (
        ("bos_id", bos_id), ("profile_start_id", profile_start_id),
        ("item_start_id", item_start_id), ("soft_id", soft_id), ("pad_id", pad_id))}
    spans = {name: [int_attr(t, name, 0, INT32_MAX) for t in span] for name, span in (
        ("intro", intro), ("before_profile", before_profile),
        ("before_recent", before_recent), ("question", question))}
    out = load_library("feature_ops").xgr_assemble_prompt_v2(
        long_item_tokens=as_int64(long_item_tokens, "long_item_tokens"),
        long_row_splits=as_int64(long_row_splits, "long_row_splits"),
        context_tokens=as_int64(context_tokens, "context_tokens"),
        recent_item_tokens=as_int64(recent_item_tokens, "recent_item_tokens"),
        recent_row_splits=as_int64(recent_row_splits, "recent_row_splits"),
        soft_tokens=int_attr(soft_tokens, "soft_tokens", 0, MAX_PROMPT_LENGTH),
        max_length=int_attr(max_length, "max_length", 0, MAX_PROMPT_LENGTH), **ids, **spans)
    return PromptV2(*out)
