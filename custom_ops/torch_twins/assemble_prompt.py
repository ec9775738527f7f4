"""Torch twin of ``XgrAssemblePrompt``: same layout, truncation and validation, vectorised.

Row layout: ``BOS PROFILE_START ctx_1..ctx_P`` (segment 0), the k-th kept item as
``ITEM_START c_0..c_{levels-1}`` (segment k+1), a trailing ``ITEM_START`` (segment n+1), then
``pad_id`` (segment -1). With ``max_length`` > 0 rows are exactly that long and a row that is
too long drops its oldest whole items.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from custom_ops.torch_twins import _checks
from xgr_common.errors import InvalidInputError, require


MAX_PROMPT_LENGTH = 2**20  # the C++ op's bound on max_length


class Prompt(NamedTuple):
    token_ids: torch.Tensor    # int32 [B, L]
    lengths: torch.Tensor      # int32 [B]
    segment_ids: torch.Tensor  # int32 [B, L]


def assemble_prompt(context_tokens: torch.Tensor, item_tokens: torch.Tensor,
                    item_row_splits: torch.Tensor, *, bos_id: int, profile_start_id: int,
                    item_start_id: int, pad_id: int, max_length: int = 0) -> Prompt:
    """context_tokens int64 [B, P]; item_tokens int64 [E', levels]; item_row_splits int64
    [B+1] -> ``Prompt(token_ids int32 [B, L], lengths int32 [B], segment_ids int32 [B, L])``."""
    for value, name in ((bos_id, "bos_id"), (profile_start_id, "profile_start_id"),
                        (item_start_id, "item_start_id"), (pad_id, "pad_id")):
        _checks.int_attr(value, 0, _checks.INT32_MAX, name)
    _checks.int_attr(max_length, 0, MAX_PROMPT_LENGTH, "max_length")
    context = _checks.int64_tensor(context_tokens, "context_tokens", 2)
    items = _checks.int64_tensor(item_tokens, "item_tokens", 2)
    _checks.same_device(context_tokens=context, item_tokens=items,
                        item_row_splits=_checks.int64_tensor(item_row_splits, "item_row_splits", 1))
    require(items.shape[1] >= 1, InvalidInputError,
            f"item_tokens must have at least one level (column), got shape {tuple(items.shape)}")
    splits = _checks.row_splits(item_row_splits, items.shape[0], "item_row_splits", "item_tokens")
    batch = splits.numel() - 1
    require(context.shape[0] == batch, InvalidInputError,
            f"context_tokens must have one row per prompt ({batch} from item_row_splits), "
            f"got shape {tuple(context.shape)}")
    _checks.values_in_range(context, 0, _checks.INT32_MAX, "context_tokens")
    _checks.values_in_range(items, 0, _checks.INT32_MAX, "item_tokens")
    num_context, levels = context.shape[1], items.shape[1]
    item_len, fixed = 1 + levels, 3 + num_context
    require(max_length == 0 or fixed <= max_length, InvalidInputError,
            f"max_length={max_length} cannot hold even a prompt without items: BOS, "
            f"PROFILE_START, {num_context} context tokens and ITEM_START need {fixed}")

    counts = splits.diff()
    kept = counts if max_length == 0 else counts.clamp(max=(max_length - fixed) // item_len)
    too_long = torch.nonzero(kept > (_checks.INT32_MAX - fixed) // item_len).flatten()
    require(too_long.numel() == 0, InvalidInputError,
            f"row {int(too_long[0]) if too_long.numel() else -1} would exceed 2^31 - 1 tokens")
    lengths = fixed + kept * item_len
    length = max_length if max_length else (int(lengths.max()) if batch else 0)

    device = items.device
    if batch == 0:
        empty = torch.zeros((0, length), dtype=torch.int32, device=device)
        return Prompt(empty, torch.zeros(0, dtype=torch.int32, device=device), empty.clone())
    tokens = torch.full((batch, length), pad_id, dtype=torch.int64, device=device)
    segments = torch.full((batch, length), -1, dtype=torch.int64, device=device)
    tokens[:, 0], tokens[:, 1], tokens[:, 2:2 + num_context] = bos_id, profile_start_id, context
    segments[:, :2 + num_context] = 0
    # Each input item's index among its row's kept items; negative = dropped as too old.
    item_rows = _checks.row_ids(splits)
    in_row = torch.arange(items.shape[0], device=device) - splits[:-1][item_rows]
    k = in_row - (counts - kept)[item_rows]
    keep = k >= 0
    k, item_rows = k[keep], item_rows[keep]
    starts = item_rows * length + 2 + num_context + k * item_len   # flat ITEM_START positions
    block = starts[:, None] + torch.arange(item_len, device=device)
    block_tokens = torch.cat([torch.full_like(k, item_start_id)[:, None], items[keep]], dim=1)
    tokens.view(-1)[block.flatten()] = block_tokens.flatten()
    segments.view(-1)[block.flatten()] = (k + 1).repeat_interleave(item_len)
    # The trailing ITEM_START opens the segment of the item to generate.
    trailing = torch.arange(batch, device=device) * length + lengths - 1
    tokens.view(-1)[trailing] = item_start_id
    segments.view(-1)[trailing] = kept + 1
    return Prompt(tokens.to(torch.int32), lengths.to(torch.int32), segments.to(torch.int32))
