"""Input validation shared by the Torch twins: the rules the C++ ops enforce with OP_REQUIRES.

Each check raises ``InvalidInputError`` naming the argument and the rule.
"""

from __future__ import annotations

import torch

from xgr_common.errors import InvalidInputError, require

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def int64_tensor(value: object, name: str, rank: int) -> torch.Tensor:
    """``value`` must already be an int64 tensor of the given rank (no silent conversions)."""
    require(isinstance(value, torch.Tensor), InvalidInputError,
            f"{name} must be a torch.Tensor, got {type(value).__name__}")
    require(value.dtype == torch.int64, InvalidInputError,
            f"{name} must be int64, got {value.dtype}")
    require(value.dim() == rank, InvalidInputError,
            f"{name} must have rank {rank}, got shape {tuple(value.shape)}")
    return value


def row_splits(value: object, num_values: int, name: str, values_name: str) -> torch.Tensor:
    """Row splits [B+1]: non-empty, starting at 0, non-decreasing, ending at ``num_values``."""
    splits = int64_tensor(value, name, 1)
    require(splits.numel() >= 1, InvalidInputError,
            f"{name} must have at least one entry (batch + 1), got 0")
    require(int(splits[0]) == 0, InvalidInputError, f"{name} must start at 0, got {int(splits[0])}")
    drops = torch.nonzero(splits[1:] < splits[:-1]).flatten()
    require(drops.numel() == 0, InvalidInputError,
            f"{name} must be non-decreasing, got a decrease after index "
            f"{int(drops[0]) if drops.numel() else -1}")
    require(int(splits[-1]) == num_values, InvalidInputError,
            f"{name} must end at the length of {values_name} ({num_values}), got {int(splits[-1])}")
    return splits


def values_in_range(t: torch.Tensor, lo: int, hi: int, name: str) -> None:
    if t.numel():
        got_lo, got_hi = int(t.min()), int(t.max())
        require(lo <= got_lo and got_hi <= hi, InvalidInputError,
                f"{name} values must lie in [{lo}, {hi}], got values in [{got_lo}, {got_hi}]")


def int_attr(value: object, lo: int, hi: int, name: str) -> int:
    """A Python int attribute (bool refused) in [lo, hi]."""
    require(isinstance(value, int) and not isinstance(value, bool), InvalidInputError,
            f"attribute {name} must be an int, got {type(value).__name__}")
    require(lo <= value <= hi, InvalidInputError,
            f"attribute {name} must lie in [{lo}, {hi}], got {value}")
    return value


def row_ids(splits: torch.Tensor) -> torch.Tensor:
    """Row index of every value: int64 [E] from row splits [B+1]."""
    batch = splits.numel() - 1
    return torch.repeat_interleave(torch.arange(batch, device=splits.device), splits.diff())


def same_device(**tensors: torch.Tensor) -> torch.device:
    """All tensors on one device (the TF op sees one host buffer); returns that device."""
    devices = {name: t.device for name, t in tensors.items()}
    require(len(set(devices.values())) == 1, InvalidInputError,
            f"inputs must be on one device, got {devices}")
    return next(iter(devices.values()))


def timed_sequence(values: object, timestamps: object, splits_in: object,
                   request_time: object) -> tuple[torch.Tensor, ...]:
    """The history ops' inputs checked as their C++ ops check them (ranks, lengths, splits,
    one request time per row, timestamps non-decreasing inside each row). Returns values,
    timestamps, request_time, the splits and each event's row, all int64."""
    values = int64_tensor(values, "values", 1)
    timestamps = int64_tensor(timestamps, "timestamps", 1)
    request_time = int64_tensor(request_time, "request_time", 1)
    same_device(values=values, timestamps=timestamps, request_time=request_time,
                row_splits=int64_tensor(splits_in, "row_splits", 1))
    num_events = values.numel()
    require(timestamps.numel() == num_events, InvalidInputError,
            f"timestamps must have the length of values ({num_events}), got {timestamps.numel()}")
    splits = row_splits(splits_in, num_events, "row_splits", "values")
    batch = splits.numel() - 1
    require(request_time.numel() == batch, InvalidInputError,
            f"request_time must have one entry per row ({batch}), got {request_time.numel()}")
    rows = row_ids(splits)
    back_in_time = torch.nonzero((rows[1:] == rows[:-1]) & (timestamps[1:] < timestamps[:-1]))
    require(back_in_time.numel() == 0, InvalidInputError,
            "timestamps must be non-decreasing inside each row; row "
            f"{int(rows[back_in_time[0, 0]]) if back_in_time.numel() else -1} goes back in time")
    return values, timestamps, request_time, splits, rows
