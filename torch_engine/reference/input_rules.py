"""Plain-torch reference of the value rules and the sanitised copy of ``Engine.recommend``'s
inputs (``torch_engine.kernels.input_rules`` computes the same, bit for bit, in one launch).

For request b with length ``n = lengths[b]`` over a row of width L, the flags, one per rule of
``xgr_common.value_rules.VALUE_RULES`` in its order:

    lengths_positive  any(n < 1)
    lengths_fit       any(n > L)
    token_range       any token id outside [0, vocab_size) within the length
    segment_order     any segment id < 0 within the length, or smaller than its left
                      neighbour where that slot is within the length (0 when causal)
    exclusion_ids     any exclusion id < -1
    positions         max(n)                                 flags: [FLAG_COUNT] int64

and the sanitised copy:

    kept           = clamp(n, 1, L)
    tokens_out     = token id where slot < kept and 0 <= id < vocab_size, else 0  [B, L] int64
    total_lengths  = kept + prefix                                          [B] int64
    segments_out   = cummax(clamp(segments, min=0)) along the whole row (zeros when causal)
                                                                            [B, L] int32
    exclude_out    = exclude                                                [B, X] int64

The search runs on the sanitised copy whatever the flags say, so it never indexes out of
bounds; ``checks.Verdict`` reads the flags once and raises for the first rule broken.
Device ops only: no value reaches the host; the function traces (``torch.export``).

**Padded buffers** (``extent``): a captured search reads fixed buffers of a bucketed shape
``[B', L']`` (``runner.StaticInputs``) whose top-left ``[B, L]`` corner holds this call's
request and whose remaining entries are stale values of earlier calls. ``extent`` is a ``[1]``
int64 device tensor ``xgr_common.buckets.pack_extent(B, L, X)``: rows ``>= B`` are padding,
read as one-token requests (``tokens_out`` 0, segment 0, ``total_lengths = 1 + prefix``,
exclusions -1) that raise no flag; within a real row the width is ``L`` (the rule ``n <= L``,
tokens and segments past it 0) and exclusion columns ``>= X`` are -1. With
``extent = pack_extent(B', L', X')`` the result equals the plain call.
"""

from __future__ import annotations

import torch

from xgr_common.buckets import EXTENT_BITS, EXTENT_LIMIT
from xgr_common.value_rules import VALUE_RULES


def unpack_extent(extent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, width, excluded) as 0-d int64 tensors on the extent's device (no host read)."""
    packed, mask = extent.reshape(()), EXTENT_LIMIT - 1
    return (packed & mask, (packed >> EXTENT_BITS) & mask,
            (packed >> 2 * EXTENT_BITS) & mask)


def input_rules(tokens: torch.Tensor, lengths: torch.Tensor, segments: torch.Tensor | None,
                exclude: torch.Tensor, vocab_size: int, prefix: int, causal: bool,
                extent: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, ...]:
    """tokens: ``[B, L]`` integer; lengths: ``[B]`` integer; segments: ``[B, L]`` int32, or
    None when ``causal`` (ignored then); exclude: ``[B, X]`` integer (-1 = padding); extent:
    None, or for padded buffers ``[1]`` int64 ``pack_extent(rows, width, excluded)``.
    Returns (flags ``[FLAG_COUNT]`` int64, tokens_out ``[B, L]`` int64, total_lengths ``[B]`` int64,
    segments_out ``[B, L]`` int32, exclude_out ``[B, X]`` int64), all on the tokens' device."""
    tokens = tokens.to(torch.int64)
    device = tokens.device
    lens = lengths.to(device=device, dtype=torch.int64)
    exclude = exclude.to(device=device, dtype=torch.int64)
    batch, width = tokens.shape
    slots = torch.arange(width, device=device)[None, :]
    columns = torch.arange(exclude.shape[1], device=device)[None, :]
    if extent is None:
        real = torch.ones(batch, dtype=torch.bool, device=device)
        limit, excluded = width, exclude.shape[1]     # ints here, 0-d tensors from an extent
    else:
        rows, limit, excluded = unpack_extent(extent)
        real = torch.arange(batch, device=device) < rows
        lens = torch.where(real, lens, 1)             # padding rows: one-token requests
    inside = (slots < limit) & real[:, None]
    valid = inside & (slots < lens[:, None])
    in_range = (tokens >= 0) & (tokens < vocab_size)
    flags = {"lengths_positive": (real & (lens < 1)).any(),
             "lengths_fit": (real & (lens > limit)).any(),
             "token_range": (valid & ~in_range).any()}
    if causal:
        flags["segment_order"] = torch.zeros((), dtype=torch.bool, device=device)
        segments_out = torch.zeros((batch, width), dtype=torch.int32, device=device)
    else:
        # Each slot against its left neighbour through a gather, not shifted slices: slices
        # of L - 1 slots make torch.export assume L - 1 >= 2 (it specialises sizes 0 and 1),
        # so a dynamic L would only export for L >= 3.
        left = segments.gather(1, (slots - 1).clamp(min=0).expand_as(segments))
        falls = valid & (slots >= 1) & (segments < left)
        flags["segment_order"] = ((segments < 0) & valid).any() | falls.any()
        segments_out = torch.cummax(segments.clamp(min=0), dim=1).values
        segments_out = torch.where(inside, segments_out, 0)
    listed = (columns < excluded) & real[:, None]
    flags["exclusion_ids"] = ((exclude < -1) & listed).any()
    flags["positions"] = torch.where(real, lens, torch.iinfo(torch.int64).min).max()
    flags = torch.stack([flags[rule.name].to(torch.int64) for rule in VALUE_RULES])
    kept = lens.clamp(min=1).clamp(max=limit)
    tokens_out = torch.where((slots < kept[:, None]) & in_range & real[:, None], tokens, 0)
    exclude_out = exclude if extent is None else torch.where(listed, exclude, -1)
    return flags, tokens_out, kept + prefix, segments_out, exclude_out
