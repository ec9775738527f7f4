"""Fixed input buffers of a captured whole search: one bucketed shape, any request that fits.

A CUDA graph reads fixed addresses, so ``SearchGraphs`` captures the whole search, the input
rules included, over the buffers of one bucketed shape (``bucket_of``: rows up to a power of
two, the prompt width with the soft prefix up to a multiple of ``length_bucket``, exclusion
columns up to a power of two). Each call:

* ``load`` copies the checked arguments (``inputs.Arguments``) into the buffers' top-left
  corners (one copy each, converting dtypes on the way) and writes the packed extent (rows,
  width, exclusion columns) with one fill: no host-to-device staging that a later call could
  overwrite before the device has read it;
* inside the graph, ``checked`` runs the input rules with that extent: entries outside the
  corner hold stale values of earlier calls and are read as padding (one-token rows that
  raise no flag, empty slots, -1 exclusions), so nothing is cleared between calls.

On the host a replayed batch costs those copies, one fill and the graph launch, instead of
the rules' launch and the padding ops of ``inputs.apply_rules``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from xgr_common.errors import InvalidInputError, require
from torch_engine.inputs import Arguments, RequestBatch, input_rules_for
from torch_engine.reference.input_rules import EXTENT_LIMIT, pack_extent

if TYPE_CHECKING:
    from torch_engine.engine import Engine


def bucket_size(value: int, multiple: int) -> int:
    """``value`` rounded up to a multiple of ``multiple``."""
    return -(-value // multiple) * multiple


def next_power_of_two(value: int) -> int:
    return 1 << max(value - 1, 0).bit_length()


@dataclass(frozen=True)
class Bucket:
    """The buffer shape that arguments of nearby shapes share (part of a graph's key)."""

    rows: int
    width: int              # token slots (the soft prefix excluded)
    soft: int               # soft tokens per request (S), exact
    excluded: int           # exclusion columns (>= 1)
    causal: bool


def bucket_of(args: Arguments, length_multiple: int, pow2_batch: bool) -> Bucket:
    """The bucket of ``args``: ``S + L`` up to a multiple of ``length_multiple`` (right
    padding, never attended), rows up to the next power of two when ``pow2_batch``, exclusion
    columns up to a power of two."""
    rows, width = args.token_ids.shape
    soft = args.soft
    excluded = 0 if args.exclude_items is None else args.exclude_items.shape[1]
    for name, value in (("token_ids rows", rows), ("token_ids width", width),
                        ("exclude_items columns", excluded)):
        require(value < EXTENT_LIMIT, InvalidInputError,
                f"{name} must be below {EXTENT_LIMIT} for a captured search, got {value}")
    return Bucket(rows=next_power_of_two(rows) if pow2_batch else rows,
                  width=bucket_size(soft + width, length_multiple) - soft, soft=soft,
                  excluded=next_power_of_two(max(excluded, 1)), causal=args.causal)


@dataclass(frozen=True)
class PaddedInputs:
    """The buffers of one bucket on the engine's device; see the module's docstring.

    token_ids ``[R, W]`` int64, lengths ``[R]`` int64, segment_ids ``[R, W]`` int32 or None
    (causal), prefix_embeds ``[R, S, hidden]`` or None, exclude_items ``[R, X]`` int64,
    extent ``[1]`` int64 (``reference.input_rules.pack_extent``).
    """

    token_ids: torch.Tensor
    lengths: torch.Tensor
    segment_ids: torch.Tensor | None
    prefix_embeds: torch.Tensor | None
    exclude_items: torch.Tensor
    extent: torch.Tensor

    @classmethod
    def allocate(cls, bucket: Bucket, hidden: int, dtype: torch.dtype, device: torch.device
                 ) -> "PaddedInputs":
        """Buffers that read as all padding until the first ``load``."""
        rows, width = bucket.rows, bucket.width
        return cls(
            token_ids=torch.zeros((rows, width), dtype=torch.int64, device=device),
            lengths=torch.ones((rows,), dtype=torch.int64, device=device),
            segment_ids=None if bucket.causal else torch.zeros((rows, width),
                                                               dtype=torch.int32,
                                                               device=device),
            prefix_embeds=None if not bucket.soft else torch.zeros(
                (rows, bucket.soft, hidden), dtype=dtype, device=device),
            exclude_items=torch.full((rows, bucket.excluded), -1, dtype=torch.int64,
                                     device=device),
            extent=torch.full((1,), pack_extent(0, 0, 0), dtype=torch.int64, device=device))

    def load(self, args: Arguments) -> None:
        """Copy ``args`` (of this bucket) into the corners and write the extent; device work
        only, no host wait."""
        rows, width = args.token_ids.shape
        self.token_ids[:rows, :width].copy_(args.token_ids)
        self.lengths[:rows].copy_(args.lengths)
        if self.segment_ids is not None:
            self.segment_ids[:rows, :width].copy_(args.segment_ids)
        if self.prefix_embeds is not None:
            self.prefix_embeds[:rows].copy_(args.prefix_embeds)
        excluded = 0
        if args.exclude_items is not None:
            excluded = args.exclude_items.shape[1]
            self.exclude_items[:rows, :excluded].copy_(args.exclude_items)
        self.extent.fill_(pack_extent(rows, width, excluded))

    def checked(self, engine: "Engine") -> tuple[RequestBatch, torch.Tensor]:
        """The sanitised batch of the bucket's shape (padding rows included) and the ``[6]``
        flags of the loaded request's rules; device work only (capturable)."""
        cfg = engine.model.config
        soft = 0 if self.prefix_embeds is None else self.prefix_embeds.shape[1]
        causal = self.segment_ids is None
        flags, tokens, total, segments, exclude = input_rules_for(self.token_ids.device)(
            self.token_ids, self.lengths, self.segment_ids, self.exclude_items,
            cfg.vocab_size, soft, causal, self.extent)
        batch = RequestBatch(token_ids=tokens, total_lengths=total, segment_ids=segments,
                             causal=causal, prefix_embeds=self.prefix_embeds,
                             exclude_items=exclude)
        return batch, flags


def search_padded(engine: "Engine", padded: PaddedInputs, beam_width: int, top_k: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What a whole-search graph captures: the rules over the loaded buffers, prefill and
    decode. Items and scores ``[R, top_k]`` for every row of the bucket (padding rows
    included) and the request's ``[6]`` flags."""
    batch, flags = padded.checked(engine)
    items, scores = engine.decode(engine.prefill(batch), beam_width, top_k)
    return items, scores, flags


def arguments_of(batch: RequestBatch) -> Arguments:
    """The arguments an already sanitised batch was made from, up to the rules' cleaning (which
    leaves a sanitised batch unchanged): lets a checked batch replay a captured search."""
    soft = 0 if batch.prefix_embeds is None else batch.prefix_embeds.shape[1]
    return Arguments(token_ids=batch.token_ids, lengths=batch.total_lengths - soft,
                     segment_ids=None if batch.causal else batch.segment_ids,
                     prefix_embeds=batch.prefix_embeds, exclude_items=batch.exclude_items)
