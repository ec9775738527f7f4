"""The bucket policy of captured searches: which padded shape a request replays in.

A captured whole search reads fixed buffers, so requests of nearby shapes share one: rows up
to the next power of two (when batch bucketing is on), the prompt width with its soft prefix
up to a multiple of the length bucket, exclusion columns up to a power of two. Pure integer
arithmetic (no torch), so a C++ runtime around an exported program can apply the same policy.

The real part of a bucket's buffers (``rows``, ``width``, ``excluded``) travels to the device
as one packed int64 (``pack_extent``), which the host writes with one fill.
"""

from __future__ import annotations

from dataclasses import dataclass

from xgr_common.errors import ConfigError, InvalidInputError, require

# Bits of each field of a packed extent (rows, width, exclusion columns).
EXTENT_BITS = 21
EXTENT_LIMIT = 1 << EXTENT_BITS


def round_up(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


def next_power_of_two(value: int) -> int:
    """The smallest power of two >= ``value`` (1 for values <= 1)."""
    return 1 << max(value - 1, 0).bit_length()


@dataclass(frozen=True)
class BucketPolicy:
    """How shapes round up. length_multiple: the prompt width with the soft prefix rounds up
    to a multiple of it; pow2_batch: rows round up to a power of two."""

    length_multiple: int = 64
    pow2_batch: bool = True

    def __post_init__(self) -> None:
        require(isinstance(self.length_multiple, int) and self.length_multiple >= 1,
                ConfigError,
                f"BucketPolicy.length_multiple must be a positive int, got "
                f"{self.length_multiple!r}")


@dataclass(frozen=True)
class Bucket:
    """The buffer shape that requests of nearby shapes share (part of a graph's key)."""

    rows: int
    width: int              # token slots (the soft prefix excluded)
    soft: int               # soft tokens per request (S), exact
    excluded: int           # exclusion columns (>= 1)
    causal: bool

    @property
    def prompt_slots(self) -> int:
        """Slots per row with the soft prefix (S + width)."""
        return self.soft + self.width


def bucket_of(rows: int, width: int, soft: int, excluded: int, causal: bool,
              policy: BucketPolicy) -> Bucket:
    """The bucket of a request batch of ``rows`` x ``width`` token slots, ``soft`` soft
    tokens per row and ``excluded`` exclusion columns (0 for none). Raises
    ``InvalidInputError`` for a size a packed extent cannot hold."""
    for name, value in (("token_ids rows", rows), ("token_ids width", width),
                        ("exclude_items columns", excluded)):
        require(value < EXTENT_LIMIT, InvalidInputError,
                f"{name} must be below {EXTENT_LIMIT} for a captured search, got {value}")
    return Bucket(rows=next_power_of_two(rows) if policy.pow2_batch else rows,
                  width=round_up(soft + width, policy.length_multiple) - soft, soft=soft,
                  excluded=next_power_of_two(max(excluded, 1)), causal=causal)


def pack_extent(rows: int, width: int, excluded: int) -> int:
    """The real part of padded buffers as one int64 (each field below ``EXTENT_LIMIT``)."""
    for name, value in (("rows", rows), ("width", width), ("excluded", excluded)):
        if not 0 <= value < EXTENT_LIMIT:
            raise ValueError(f"extent {name} must lie in [0, {EXTENT_LIMIT}), got {value}")
    return rows | width << EXTENT_BITS | excluded << 2 * EXTENT_BITS
