"""Torch twin of ``XgrCleanSequence``: same semantics, same validation, vectorised.

Per row, in order: keep events with ``request_time - window_seconds <= t <= request_time``;
collapse each run of equal consecutive values into one event carrying the run's LAST
timestamp; keep the last ``keep_last`` events.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from custom_ops.torch_twins import _checks


class CleanedSequence(NamedTuple):
    values: torch.Tensor       # int64 [E']
    timestamps: torch.Tensor   # int64 [E']
    row_splits: torch.Tensor   # int64 [B+1]


def clean_sequence(values: torch.Tensor, timestamps: torch.Tensor, row_splits: torch.Tensor,
                   request_time: torch.Tensor, *, window_seconds: int,
                   keep_last: int) -> CleanedSequence:
    """values, timestamps int64 [E]; row_splits int64 [B+1]; request_time int64 [B].

    Returns ``CleanedSequence(values [E'], timestamps [E'], row_splits [B+1])``, all int64.
    Raises ``InvalidInputError`` naming the argument on any input the TF op rejects.
    """
    _checks.int_attr(window_seconds, 1, _checks.INT64_MAX, "window_seconds")
    _checks.int_attr(keep_last, 1, _checks.INT64_MAX, "keep_last")
    values, timestamps, request_time, splits, rows = _checks.timed_sequence(
        values, timestamps, row_splits, request_time)
    batch = splits.numel() - 1

    # The window's lower edge, saturated at INT64_MIN like the C++ op (no overflow).
    lower = request_time.clamp(min=_checks.INT64_MIN + window_seconds) - window_seconds
    in_window = (timestamps <= request_time[rows]) & (timestamps >= lower[rows])
    v, t, r = values[in_window], timestamps[in_window], rows[in_window]
    # The last event of each run of equal values (within a row) represents the run.
    run_end = torch.ones_like(v, dtype=torch.bool)
    run_end[:-1] = (v[1:] != v[:-1]) | (r[1:] != r[:-1])
    v, t, r = v[run_end], t[run_end], r[run_end]
    # Rank from the end of its row: keep ranks 0 .. keep_last - 1.
    row_end = torch.cumsum(torch.bincount(r, minlength=batch), 0)
    from_end = row_end[r] - 1 - torch.arange(v.numel(), device=v.device)
    recent = from_end < keep_last
    v, t, r = v[recent], t[recent], r[recent]
    out_splits = torch.zeros(batch + 1, dtype=torch.int64, device=v.device)
    out_splits[1:] = torch.cumsum(torch.bincount(r, minlength=batch), 0)
    return CleanedSequence(v, t, out_splits)
