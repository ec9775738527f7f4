"""Torch twin of ``XgrSplitHistory``: same split, same validation, vectorised.

Blocks of ``block_seconds``; the request's block is ``open = floor(request_time /
block_seconds)``. Per row: drop events after ``request_time``; collapse each run of equal
consecutive values inside one block into its last event; the recent part is the open block's
events (the newest ``recent_items``); the long-term part is the closed blocks ``open -
long_term_blocks .. open - 1``, whole blocks from the newest back while they fit
``long_term_items`` (the newest closed block alone cut to its newest ``long_term_items``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from custom_ops.torch_twins import _checks

MAX_LONG_TERM_BLOCKS = 2 ** 40   # the C++ op's bound (no overflow below the request's block)


class SplitHistory(NamedTuple):
    long_values: torch.Tensor         # int64 [E_long]
    long_row_splits: torch.Tensor     # int64 [B+1]
    recent_values: torch.Tensor       # int64 [E_recent]
    recent_row_splits: torch.Tensor   # int64 [B+1]


def split_history(values: torch.Tensor, timestamps: torch.Tensor, row_splits: torch.Tensor,
                  request_time: torch.Tensor, *, block_seconds: int, long_term_blocks: int,
                  long_term_items: int, recent_items: int) -> SplitHistory:
    """values, timestamps int64 [E]; row_splits int64 [B+1]; request_time int64 [B].

    Returns ``SplitHistory`` (long-term and recent values with their row splits, int64).
    Raises ``InvalidInputError`` naming the argument on any input the TF op rejects.
    """
    _checks.int_attr(block_seconds, 1, _checks.INT64_MAX, "block_seconds")
    _checks.int_attr(long_term_blocks, 1, MAX_LONG_TERM_BLOCKS, "long_term_blocks")
    _checks.int_attr(long_term_items, 0, _checks.INT64_MAX, "long_term_items")
    _checks.int_attr(recent_items, 1, _checks.INT64_MAX, "recent_items")
    values, timestamps, request_time, splits, rows = _checks.timed_sequence(
        values, timestamps, row_splits, request_time)
    batch = splits.numel() - 1

    blocks = torch.div(timestamps, block_seconds, rounding_mode="floor")
    open_block = torch.div(request_time, block_seconds, rounding_mode="floor")
    # Saturated like the C++ op: a request time near INT64_MIN cannot overflow.
    oldest = open_block.clamp(min=_checks.INT64_MIN + long_term_blocks) - long_term_blocks
    live = (timestamps <= request_time[rows]) & (blocks >= oldest[rows])
    v, k, r = values[live], blocks[live], rows[live]
    # The last event of each run of equal values inside one block (and row) stays.
    run_end = torch.ones_like(v, dtype=torch.bool)
    run_end[:-1] = (v[1:] != v[:-1]) | (k[1:] != k[:-1]) | (r[1:] != r[:-1])
    v, k, r = v[run_end], k[run_end], r[run_end]
    recent = k == open_block[r]

    # Recent: rank from the end of the row's open-block events; keep ranks < recent_items.
    recent_rank = _rank_from_end(recent, r, batch)
    keep_recent = recent & (recent_rank < recent_items)

    # Long-term: for each event, the events in newer closed blocks of its row and its block's
    # size; a whole block stays while newer + size fits, and the newest block (newer == 0)
    # too large for the budget keeps its newest long_term_items events.
    closed = ~recent
    after = _rank_from_end(closed, r, batch)                     # closed events after it
    block_key = torch.stack([r, k], dim=1)
    _, block_id, block_size = torch.unique_consecutive(block_key, dim=0, return_inverse=True,
                                                       return_counts=True)
    size = block_size[block_id]
    position_in_block = _position_in_group(block_id)
    newer = after - (size - 1 - position_in_block)               # events in newer blocks
    fits = newer + size <= long_term_items
    newest_cut = (newer == 0) & (size > long_term_items) & (
        size - 1 - position_in_block < long_term_items)
    keep_long = closed & (fits | newest_cut)

    long_values, long_splits = v[keep_long], _splits(r[keep_long], batch)
    return SplitHistory(long_values, long_splits, v[keep_recent],
                        _splits(r[keep_recent], batch))


def _rank_from_end(mask: torch.Tensor, rows: torch.Tensor, batch: int) -> torch.Tensor:
    """For each position, how many ``mask`` positions of its row come after it."""
    flags = mask.to(torch.int64)
    per_row = torch.zeros(batch, dtype=torch.int64, device=mask.device).index_add_(0, rows, flags)
    through = torch.cumsum(flags, 0)
    row_start = torch.cumsum(per_row, 0) - per_row
    return per_row[rows] - (through - row_start[rows])


def _position_in_group(group: torch.Tensor) -> torch.Tensor:
    """0, 1, ... within each run of equal consecutive ``group`` ids."""
    index = torch.arange(group.numel(), device=group.device)
    starts = torch.ones_like(group, dtype=torch.bool)
    starts[1:] = group[1:] != group[:-1]
    first = torch.cummax(torch.where(starts, index, 0), 0).values
    return index - first


def _splits(rows: torch.Tensor, batch: int) -> torch.Tensor:
    counts = torch.bincount(rows, minlength=batch)
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
