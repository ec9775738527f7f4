"""Torch twin of ``XgrAssemblePromptV2``: same layout and validation, vectorised.

Row layout (``xgr_common.prompt_v2``): ``BOS intro`` (segment 0); each long-term item as
``ITEM_START c_0..c_{levels-1}`` (segments 1..n); ``before_profile, SOFT x S, PROFILE_START,
context, before_recent`` (segment n + 1); each recent item (segments n + 2 ..); ``question,
ITEM_START`` (segment n + m + 2); then ``pad_id`` (segment -1). ``frozen_lengths`` is the
length of ``BOS intro`` plus the long-term items. A row longer than ``max_length`` (> 0) is
refused, never cut.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from custom_ops.torch_twins import _checks
from xgr_common.errors import InvalidInputError, require

MAX_PROMPT_LENGTH = 2**20  # the C++ op's bound on max_length, soft_tokens and each span


class PromptV2(NamedTuple):
    token_ids: torch.Tensor       # int32 [B, L]
    lengths: torch.Tensor         # int32 [B]
    segment_ids: torch.Tensor     # int32 [B, L]
    frozen_lengths: torch.Tensor  # int32 [B]


def assemble_prompt_v2(long_item_tokens: torch.Tensor, long_row_splits: torch.Tensor,
                       context_tokens: torch.Tensor, recent_item_tokens: torch.Tensor,
                       recent_row_splits: torch.Tensor, *, bos_id: int, profile_start_id: int,
                       item_start_id: int, soft_id: int, pad_id: int, soft_tokens: int,
                       intro: Sequence[int] = (), before_profile: Sequence[int] = (),
                       before_recent: Sequence[int] = (), question: Sequence[int] = (),
                       max_length: int = 0) -> PromptV2:
    """long/recent item tokens int64 [E, levels] with row splits [B+1]; context_tokens int64
    [B, P] -> ``PromptV2``. Raises ``InvalidInputError`` where the TF op raises."""
    for value, name in ((bos_id, "bos_id"), (profile_start_id, "profile_start_id"),
                        (item_start_id, "item_start_id"), (soft_id, "soft_id"),
                        (pad_id, "pad_id")):
        _checks.int_attr(value, 0, _checks.INT32_MAX, name)
    _checks.int_attr(soft_tokens, 0, MAX_PROMPT_LENGTH, "soft_tokens")
    _checks.int_attr(max_length, 0, MAX_PROMPT_LENGTH, "max_length")
    spans = {}
    for span, name in ((intro, "intro"), (before_profile, "before_profile"),
                       (before_recent, "before_recent"), (question, "question")):
        require(len(span) <= MAX_PROMPT_LENGTH, InvalidInputError,
                f"{name} has {len(span)} tokens; at most 2^20")
        spans[name] = [_checks.int_attr(t, 0, _checks.INT32_MAX, name) for t in span]
    long_items = _checks.int64_tensor(long_item_tokens, "long_item_tokens", 2)
    context = _checks.int64_tensor(context_tokens, "context_tokens", 2)
    recent_items = _checks.int64_tensor(recent_item_tokens, "recent_item_tokens", 2)
    device = _checks.same_device(
        long_item_tokens=long_items, context_tokens=context, recent_item_tokens=recent_items,
        long_row_splits=_checks.int64_tensor(long_row_splits, "long_row_splits", 1),
        recent_row_splits=_checks.int64_tensor(recent_row_splits, "recent_row_splits", 1))
    levels = long_items.shape[1]
    require(levels >= 1 and recent_items.shape[1] == levels, InvalidInputError,
            f"long_item_tokens and recent_item_tokens must have the same number (>= 1) of "
            f"levels (columns), got shapes {tuple(long_items.shape)} and "
            f"{tuple(recent_items.shape)}")
    long_splits = _checks.row_splits(long_row_splits, long_items.shape[0], "long_row_splits",
                                     "long_item_tokens")
    recent_splits = _checks.row_splits(recent_row_splits, recent_items.shape[0],
                                       "recent_row_splits", "recent_item_tokens")
    batch = long_splits.numel() - 1
    require(recent_splits.numel() == batch + 1 and context.shape[0] == batch, InvalidInputError,
            f"long_row_splits, recent_row_splits and context_tokens must describe the same "
            f"{batch} rows, got shapes {tuple(long_splits.shape)}, {tuple(recent_splits.shape)} "
            f"and {tuple(context.shape)}")
    _checks.values_in_range(context, 0, _checks.INT32_MAX, "context_tokens")
    _checks.values_in_range(long_items, 0, _checks.INT32_MAX, "long_item_tokens")
    _checks.values_in_range(recent_items, 0, _checks.INT32_MAX, "recent_item_tokens")

    item_len = 1 + levels
    head = torch.tensor([bos_id, *spans["intro"]], dtype=torch.int64, device=device)
    profile_parts = [torch.tensor(spans["before_profile"] + [soft_id] * soft_tokens
                                  + [profile_start_id], dtype=torch.int64, device=device)]
    tail = torch.tensor(spans["question"] + [item_start_id], dtype=torch.int64, device=device)
    recent_text = torch.tensor(spans["before_recent"], dtype=torch.int64, device=device)
    profile_width = profile_parts[0].numel() + context.shape[1] + recent_text.numel()
    fixed = head.numel() + profile_width + tail.numel()
    n, m = long_splits.diff(), recent_splits.diff()
    items = n + m
    too_long = torch.nonzero(items > (_checks.INT32_MAX - fixed) // item_len).flatten()
    require(too_long.numel() == 0, InvalidInputError,
            f"row {int(too_long[0]) if too_long.numel() else -1} with "
            f"{int(items[too_long[0]]) if too_long.numel() else 0} items would exceed 2^31 - 1 "
            f"tokens")
    lengths = fixed + items * item_len
    over = torch.nonzero((lengths > max_length) if max_length else torch.zeros_like(lengths,
                                                                                  dtype=torch.bool)
                         ).flatten()
    require(over.numel() == 0, InvalidInputError,
            f"row {int(over[0]) if over.numel() else -1} needs "
            f"{int(lengths[over[0]]) if over.numel() else 0} tokens, more than "
            f"max_length={max_length}; the history split's budgets must fit the prompt (a cut "
            f"would move the frozen long-term part)")
    length = max_length if max_length else (int(lengths.max()) if batch else 0)
    frozen = head.numel() + n * item_len
    if batch == 0:
        empty = torch.zeros((0, length), dtype=torch.int32, device=device)
        none = torch.zeros(0, dtype=torch.int32, device=device)
        return PromptV2(empty, none, empty.clone(), none.clone())

    tokens = torch.full((batch, length), pad_id, dtype=torch.int64, device=device)
    segments = torch.full((batch, length), -1, dtype=torch.int64, device=device)
    flat_tokens, flat_segments = tokens.view(-1), segments.view(-1)
    rows = torch.arange(batch, device=device)
    tokens[:, :head.numel()] = head
    segments[:, :head.numel()] = 0
    _put_items(flat_tokens, flat_segments, long_items, long_splits, length,
               torch.full_like(n, head.numel()), first_segment=torch.ones_like(n),
               item_start_id=item_start_id)
    # The profile block: text, SOFT x S, PROFILE_START, the context, text; segment n + 1.
    block = torch.cat([profile_parts[0].expand(batch, -1), context,
                       recent_text.expand(batch, -1)], dim=1)
    where = (rows * length + frozen)[:, None] + torch.arange(profile_width, device=device)
    flat_tokens[where.flatten()] = block.flatten()
    flat_segments[where.flatten()] = (n + 1).repeat_interleave(profile_width)
    recent_start = frozen + profile_width
    _put_items(flat_tokens, flat_segments, recent_items, recent_splits, length, recent_start,
               first_segment=n + 2, item_start_id=item_start_id)
    where = (rows * length + recent_start + m * item_len)[:, None] + torch.arange(
        tail.numel(), device=device)
    flat_tokens[where.flatten()] = tail.expand(batch, -1).flatten()
    flat_segments[where.flatten()] = (n + m + 2).repeat_interleave(tail.numel())
    return PromptV2(tokens.to(torch.int32), lengths.to(torch.int32), segments.to(torch.int32),
                    frozen.to(torch.int32))


def _put_items(flat_tokens: torch.Tensor, flat_segments: torch.Tensor, items: torch.Tensor,
               splits: torch.Tensor, length: int, start: torch.Tensor,
               first_segment: torch.Tensor, item_start_id: int) -> None:
    """Writes each row's items (``ITEM_START`` and its codes) from ``start[row]`` on, the k-th
    in segment ``first_segment[row] + k``."""
    if items.shape[0] == 0:
        return
    item_len = 1 + items.shape[1]
    rows = _checks.row_ids(splits)
    k = torch.arange(items.shape[0], device=items.device) - splits[:-1][rows]
    first = rows * length + start[rows] + k * item_len
    where = first[:, None] + torch.arange(item_len, device=items.device)
    values = torch.cat([torch.full_like(k, item_start_id)[:, None], items], dim=1)
    flat_tokens[where.flatten()] = values.flatten()
    flat_segments[where.flatten()] = (first_segment[rows] + k).repeat_interleave(item_len)
