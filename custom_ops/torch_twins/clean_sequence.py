"""Torch twin of ``XgrCleanSequence``: same semantics, same validation, vectorised.

Per row, in order: keep events with ``request_time - window_seconds <= t <= request_time``;
collapse each run of equal consecutive values into one event carrying the run's LAST
timestamp; keep the last ``keep_last`` events.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from custom_ops.torch_twins import _checks
from xgr_common.errors import InvalidInputError, require


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
    values = _checks.int64_tensor(values, "values", 1)
    timestamps = _checks.int64_tensor(timestamps, "timestamps", 1)
    request_time = _checks.int64_tensor(request_time, "request_time", 1)
    _checks.same_device(values=values, timestamps=timestamps, request_time=request_time,
                        row_splits=_checks.int64_tensor(row_splits, "row_splits", 1))
    num_events = values.numel()
    require(timestamps.numel() == num_events, InvalidInputError,
            f"timestamps must have the length of values ({num_events}), got {timestamps.numel()}")
    splits = _checks.row_splits(row_splits, num_events, "row_splits", "values")
    batch = splits.numel() - 1
    require(request_time.numel() == batch, InvalidInputError,
            f"request_time must have one entry per row ({batch}), got {request_time.numel()}")
    rows = _checks.row_ids(splits)
    back_in_time = torch.nonzero((rows[1:] == rows[:-1]) & (timestamps[1:] < timestamps[:-1]))
    require(back_in_time.numel() == 0, InvalidInputError,
            "timestamps must be non-decreasing inside each row; row "
            f"{int(rows[back_in_time[0, 0]]) if back_in_time.numel() else -1} goes back in time")

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
