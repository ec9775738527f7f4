"""The value rules and the sanitised copy of ``Engine.recommend``'s inputs in one Triton launch,
for the serving path on CUDA.

With plain torch ops the rules take about 30 small launches per request, whose host time is a
noticeable share of a whole request that replays as one CUDA graph. Here one program per
request row:

* loops over its row in blocks of ``BLOCK`` slots: token ids out of range within the length,
  segment ids negative or falling within the length (the left neighbour is a second, cached
  load at ``slot - 1``, so block edges need no special case), and writes the sanitised tokens
  and the running maximum of the clamped segment ids (``tl.associative_scan`` with a max
  combine inside a block, plus the maximum carried from the blocks before);
* loops over its exclusion row in blocks of ``EXCLUDE_BLOCK`` ids (ids < -1);
* combines its flags, one per rule of ``xgr_common.value_rules.VALUE_RULES`` in its order,
  into the batch's ``[FLAG_COUNT]`` int64 flags with ``atomic_max``. The buffer starts at the
  smallest int64 (one fill), so every entry is the exact maximum over the rows, the longest
  length included when every length is negative.

With ``EXTENT`` (padded buffers of a captured search, ``runner.StaticInputs``) each program
first reads the packed extent: a padding row becomes a one-token request and raises no flag,
slots past the real width and exclusion columns past the real count are written as padding.

Same function, bit for bit, as ``torch_engine.reference.input_rules`` (read its docstring for
the rules). The launcher checks shapes, dtypes, contiguity and devices (never values, which
would cost a host synchronisation) and raises ``InvalidInputError`` naming the argument and
the rule. A plain launch (no custom op): the runner calls it before an eager search, and the
captured whole-search graphs run it as their first kernel (outside tracing either way).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from xgr_common.errors import InvalidInputError, require
from torch_engine.kernels import _common as c
from xgr_common.buckets import EXTENT_BITS
from xgr_common.value_rules import FLAG_COUNT, FLAG_INDEX

_OP = "input_rules"
_INT64_MIN = -(2**63)
# Slots per block of a row: a 16K-token row takes 16 steps of one program.
_MAX_BLOCK = 1024
# Where each rule's flag goes (the table's order), as constants the kernel reads.
_FLAGS = tl.constexpr(FLAG_COUNT)
_FLAG_SLOTS = tl.constexpr(triton.next_power_of_2(FLAG_COUNT))
_SHORT = tl.constexpr(FLAG_INDEX["lengths_positive"])
_LONG = tl.constexpr(FLAG_INDEX["lengths_fit"])
_TOKENS = tl.constexpr(FLAG_INDEX["token_range"])
_SEGMENTS = tl.constexpr(FLAG_INDEX["segment_order"])
_EXCLUDE = tl.constexpr(FLAG_INDEX["exclusion_ids"])
_POSITIONS = tl.constexpr(FLAG_INDEX["positions"])


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _input_rules_kernel(tokens_ptr, lengths_ptr, segments_ptr, exclude_ptr, flags_ptr,
                        tokens_out_ptr, total_ptr, segments_out_ptr, exclude_out_ptr,
                        extent_ptr, width, excluded, vocab_size, prefix, CAUSAL: tl.constexpr,
                        EXTENT: tl.constexpr, EXTENT_BITS: tl.constexpr, BLOCK: tl.constexpr,
                        EXCLUDE_BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    length = tl.load(lengths_ptr + row).to(tl.int64)
    if EXTENT:
        # Padded buffers: the real rows, width and exclusion columns of this call, packed.
        packed = tl.load(extent_ptr)
        field = (1 << EXTENT_BITS) - 1
        # (an int1 block: Triton's interpreter refuses a bare scalar comparison in a mask)
        real = tl.full((), 1, tl.int1) & (row < (packed & field))
        limit = (packed >> EXTENT_BITS) & field
        listed = (packed >> (2 * EXTENT_BITS)) & field
        length = tl.where(real, length, 1)          # padding rows: one-token requests
    else:
        real = tl.full((), 1, tl.int1)
        # (sums, not casts: Triton passes an int argument equal to 1 as a constant)
        limit = tl.zeros((), tl.int64) + width
        listed = tl.zeros((), tl.int64) + excluded
    kept = tl.minimum(tl.maximum(length, 1), limit)
    tl.store(total_ptr + row, kept + prefix)

    bad_token = tl.zeros((), dtype=tl.int32)
    bad_segment = tl.zeros((), dtype=tl.int32)
    carry = tl.zeros((), dtype=tl.int32)        # running max of clamp(segments, 0) so far
    base = row * width
    for start in range(0, width, BLOCK):
        slot = start + tl.arange(0, BLOCK)
        inside = slot < width
        used = (slot < limit) & real                # a slot of this call's request
        valid = used & (slot < length)
        token = tl.load(tokens_ptr + base + slot, mask=inside, other=0).to(tl.int64)
        in_range = (token >= 0) & (token < vocab_size)
        bad_token = tl.maximum(bad_token, tl.max((valid & ~in_range).to(tl.int32), axis=0))
        kept_token = tl.where((slot < kept) & in_range & real, token, 0)
        tl.store(tokens_out_ptr + base + slot, kept_token, mask=inside)
        if CAUSAL:
            tl.store(segments_out_ptr + base + slot, tl.zeros((BLOCK,), dtype=tl.int32),
                     mask=inside)
        else:
            segment = tl.load(segments_ptr + base + slot, mask=inside, other=0)
            left = tl.load(segments_ptr + base + slot - 1, mask=inside & (slot >= 1), other=0)
            falls = valid & (slot >= 1) & (segment < left)
            broken = (valid & (segment < 0)) | falls
            bad_segment = tl.maximum(bad_segment, tl.max(broken.to(tl.int32), axis=0))
            clamped = tl.maximum(segment, 0)
            running = tl.maximum(tl.associative_scan(clamped, 0, _max_combine), carry)
            tl.store(segments_out_ptr + base + slot, tl.where(used, running, 0), mask=inside)
            carry = tl.maximum(carry, tl.max(clamped, axis=0))

    bad_exclude = tl.zeros((), dtype=tl.int32)
    exclude_base = row * excluded
    for start in range(0, excluded, EXCLUDE_BLOCK):
        slot = start + tl.arange(0, EXCLUDE_BLOCK)
        inside = slot < excluded
        item = tl.load(exclude_ptr + exclude_base + slot, mask=inside, other=-1)
        counted = (slot < listed) & real
        bad_exclude = tl.maximum(bad_exclude,
                                 tl.max((counted & (item < -1)).to(tl.int32), axis=0))
        if EXTENT:
            tl.store(exclude_out_ptr + exclude_base + slot, tl.where(counted, item, -1),
                     mask=inside)

    entry = tl.arange(0, _FLAG_SLOTS)
    value = tl.where(entry == _SHORT, (length < 1).to(tl.int64),
            tl.where(entry == _LONG, (length > limit).to(tl.int64),
            tl.where(entry == _TOKENS, bad_token.to(tl.int64),
            tl.where(entry == _SEGMENTS, bad_segment.to(tl.int64),
            tl.where(entry == _EXCLUDE, bad_exclude.to(tl.int64),
            tl.where(entry == _POSITIONS, length, 0))))))
    tl.atomic_max(flags_ptr + entry, value, mask=(entry < _FLAGS) & real)


def _warps(block: int, exclude_block: int) -> int:
    """8 warps for 1024-slot blocks: with 4, the padded form's extra live values spill to the
    stack in an sm_90 compile; with 8 they fit in registers."""
    return 8 if max(block, exclude_block) >= 1024 else 4


def _pick_block(size: int, block: int | None, name: str) -> int:
    """A power-of-two block of at least 16 slots: ``block`` when given, else the size rounded
    up to a power of two, at most ``_MAX_BLOCK``."""
    if block is None:
        return max(16, min(triton.next_power_of_2(max(size, 1)), _MAX_BLOCK))
    require(isinstance(block, int) and block >= 16 and block & (block - 1) == 0,
            InvalidInputError, f"{_OP}: {name} must be a power of two >= 16, got {block!r}")
    return block


def _integer(name: str, tensor, allowed: tuple[torch.dtype, ...] | None) -> None:
    """A tensor of an integer dtype (one of ``allowed`` when given)."""
    require(isinstance(tensor, torch.Tensor), InvalidInputError,
            f"{_OP}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if allowed is not None:
        c.check_index(_OP, name, tensor, allowed)
        return
    require(not tensor.is_floating_point() and not tensor.is_complex()
            and tensor.dtype != torch.bool, InvalidInputError,
            f"{_OP}: {name} must have an integer dtype, got {tensor.dtype}")
    require(tensor.is_contiguous(), InvalidInputError,
            f"{_OP}: {name} must be contiguous, got strides {tensor.stride()}")


def _check_inputs(tokens, lengths, segments, exclude, vocab_size, prefix, causal,
                  extent) -> None:
    _integer("tokens", tokens, None)
    _integer("lengths", lengths, None)
    _integer("exclude", exclude, (torch.int64,))
    c.check_rank(_OP, "tokens", tokens, 2, "[B, L]")
    c.check_rank(_OP, "lengths", lengths, 1, "[B]")
    c.check_rank(_OP, "exclude", exclude, 2, "[B, X]")
    batch, width = tokens.shape
    require(batch >= 1 and width >= 1, InvalidInputError,
            f"{_OP}: tokens must hold at least one row and one slot, got shape "
            f"{tuple(tokens.shape)}")
    c.check_dim(_OP, "lengths", lengths, 0, batch, "B, one length per row of tokens")
    c.check_dim(_OP, "exclude", exclude, 0, batch, "B, one exclusion row per row of tokens")
    require(isinstance(causal, bool), InvalidInputError,
            f"{_OP}: causal must be a bool, got {causal!r}")
    require(isinstance(vocab_size, int) and not isinstance(vocab_size, bool)
            and 1 <= vocab_size < 2**62, InvalidInputError,
            f"{_OP}: vocab_size must be an int in [1, 2**62), got {vocab_size!r}")
    require(isinstance(prefix, int) and not isinstance(prefix, bool) and 0 <= prefix < 2**62,
            InvalidInputError, f"{_OP}: prefix must be an int in [0, 2**62), got {prefix!r}")
    tensors = {"tokens": tokens, "lengths": lengths, "exclude": exclude}
    if causal:
        require(segments is None, InvalidInputError,
                f"{_OP}: segments must be None when causal (a causal prompt has no segment "
                f"ids), got a {type(segments).__name__}")
    else:
        require(segments is not None, InvalidInputError,
                f"{_OP}: segments ([B, L] int32) are required unless causal")
        _integer("segments", segments, (torch.int32,))
        c.check_same_shape(_OP, "segments", segments, "tokens", tokens, "[B, L]")
        tensors["segments"] = segments
    if extent is not None:
        _integer("extent", extent, (torch.int64,))
        c.check_rank(_OP, "extent", extent, 1, "[1] (xgr_common.buckets.pack_extent)")
        c.check_dim(_OP, "extent", extent, 0, 1, "1, the packed extent")
        tensors["extent"] = extent
    c.check_devices(_OP, tensors)


def input_rules(tokens: torch.Tensor, lengths: torch.Tensor, segments: torch.Tensor | None,
                exclude: torch.Tensor, vocab_size: int, prefix: int, causal: bool,
                extent: torch.Tensor | None = None, *, block: int | None = None,
                exclude_block: int | None = None) -> tuple[torch.Tensor, ...]:
    """The value rules and the sanitised copy of one batch in one launch.

    tokens: ``[B, L]`` integer, contiguous (int32 and int64 read as they are, other integer
    dtypes widened first); lengths: ``[B]`` integer (likewise); segments: ``[B, L]`` int32
    contiguous, or None exactly when ``causal``; exclude: ``[B, X]`` int64 contiguous (-1 =
    padding); extent: None, or for padded buffers a ``[1]`` int64 tensor
    ``xgr_common.buckets.pack_extent(rows, width, excluded)``; all on one device (CUDA, or
    the CPU under ``TRITON_INTERPRET=1``). block, exclude_block: slots per loop step (powers of
    two >= 16; default: the row rounded up, at most 1024).

    Returns (flags ``[FLAG_COUNT]`` int64, tokens_out ``[B, L]`` int64, total_lengths ``[B]`` int64,
    segments_out ``[B, L]`` int32, exclude_out ``[B, X]`` int64: ``exclude`` itself without an
    extent), as ``torch_engine.reference.input_rules``. No host read.
    """
    _check_inputs(tokens, lengths, segments, exclude, vocab_size, prefix, causal, extent)
    if tokens.dtype not in c.INDEX_DTYPES:
        tokens = tokens.to(torch.int64)
    if lengths.dtype not in c.INDEX_DTYPES:
        lengths = lengths.to(torch.int64)
    batch, width = tokens.shape
    device = tokens.device
    block = _pick_block(width, block, "block")
    exclude_block = _pick_block(exclude.shape[1], exclude_block, "exclude_block")
    flags = torch.full((FLAG_COUNT,), _INT64_MIN, dtype=torch.int64, device=device)
    tokens_out = torch.empty((batch, width), dtype=torch.int64, device=device)
    total = torch.empty((batch,), dtype=torch.int64, device=device)
    segments_out = torch.empty((batch, width), dtype=torch.int32, device=device)
    exclude_out = exclude if extent is None else torch.empty_like(exclude)
    # Stand-ins for inputs never read (no segments; no exclusion column; no extent), so no
    # launch gets an empty tensor's null pointer.
    segments = segments_out if causal else segments
    exclude_rows = exclude if exclude.shape[1] else flags
    with c.on_device(device):
        _input_rules_kernel[(batch,)](
            tokens, lengths, segments, exclude_rows, flags, tokens_out, total,
            segments_out, exclude_out if exclude.shape[1] else flags,
            flags if extent is None else extent, width, exclude.shape[1], vocab_size, prefix,
            CAUSAL=causal, EXTENT=extent is not None, EXTENT_BITS=EXTENT_BITS, BLOCK=block,
            EXCLUDE_BLOCK=exclude_block, num_warps=_warps(block, exclude_block))
    return flags, tokens_out, total, segments_out, exclude_out
