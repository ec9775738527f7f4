"""KV storage of one batch: the shared prompt KV (packed, written once) and the per-beam KV.

Shared KV: per layer ``[T, Hkv, D]`` where the prompts of the batch are concatenated without
padding (request b at rows ``cu_seqlens[b]:cu_seqlens[b+1]``); read-only during decode.
Beam KV: ``[B, W, S, layers, Hkv, D]`` with ``S = levels - 1`` slots; decode step s writes slot
s, and reordering the beams copies only the slots written so far, never the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from xgr_common.layout import PAD_SEGMENT, MaskMode


@dataclass(frozen=True)
class PackedPrompt:
    """Where each request's tokens sit in the packed layout.

    lengths: ``[B]`` int64 tokens per request (soft prefix included);
    cu_seqlens: ``[B+1]`` int32 running offsets (request starts when ``seq_lens`` is given),
    ``cu_seqlens[-1] == T``;
    positions: ``[T]`` int64 position of each packed token inside its request;
    segment_ids: ``[T]`` int32 packed segment ids;
    gather: ``[B, Lmax]`` int64 packed row of each padded slot (clamped for padding);
    valid: ``[B, Lmax]`` bool, True where the padded slot holds a token;
    rows: ``[T]`` int64 flat padded slot (``b * Lmax + l``) of each packed token;
    prefill_cu_seqlens: ``[B+1]`` int32 offsets the prefill kernel reads (see ``static``);
    mode: the prefill mask rule.

    seq_lens: ``[B]`` int32 or None. None: the compact layout above. Given: the request-major
    layout of ``static=True``, where request b starts at ``cu_seqlens[b]`` and holds
    ``seq_lens[b]`` tokens, and ``cu_seqlens[b + 1] - cu_seqlens[b]`` is its stride.

    With ``static=True`` the packed buffers are the padded ones flattened (``T = B * Lmax``):
    slot l of request b is row ``b * Lmax + l`` and ``cu_seqlens = prefill_cu_seqlens =
    [0, Lmax, 2 Lmax, ...]``. Each request's padding tail gets a segment of its own after its
    last token's, so no real token attends it in any mask rule. Every shape is then fixed by
    the inputs' shapes: no host wait, capturable in a CUDA graph, at the cost of computing the
    padding slots' projections and MLP. Packing is then a view, and each request's rows sit
    at a fixed stride, so a causal batch can go to the library's attention kernel as
    ``[B, Lmax]`` rows.
    """

    lengths: torch.Tensor
    cu_seqlens: torch.Tensor
    positions: torch.Tensor
    segment_ids: torch.Tensor
    gather: torch.Tensor
    valid: torch.Tensor
    rows: torch.Tensor
    prefill_cu_seqlens: torch.Tensor
    mode: MaskMode
    seq_lens: torch.Tensor | None = None

    @classmethod
    def from_padded(cls, valid: torch.Tensor, segment_ids: torch.Tensor,
                    mode: MaskMode, static: bool = False) -> "PackedPrompt":
        """Describe right-padded rows ``valid [B, Lmax]`` (bool) with ``segment_ids [B, Lmax]``.

        Unless ``static``, ``T`` is data-dependent: finding the valid slots (``nonzero``) is
        the one place the host waits for the device; packing and unpacking afterwards are
        plain gathers.
        """
        lengths = valid.sum(dim=1)
        batch, width = valid.shape
        if static:
            # Request-major: the padded slots as they stand. Offsets come from a device arange
            # (no host-to-device copy); each padding tail takes the segment after its
            # request's last token.
            rows = torch.arange(batch * width, device=valid.device)
            starts = torch.arange(batch + 1, device=valid.device, dtype=torch.int32) * width
            last_segment = segment_ids.gather(1, (lengths - 1).clamp(min=0)[:, None])
            segments = torch.where(valid, segment_ids, last_segment + 1).flatten()
            return cls(lengths=lengths, cu_seqlens=starts, positions=rows % width,
                       segment_ids=segments.to(torch.int32), gather=rows.view(batch, width),
                       valid=valid, rows=rows, prefill_cu_seqlens=starts, mode=MaskMode(mode),
                       seq_lens=lengths.to(torch.int32))
        cu = torch.zeros(batch + 1, dtype=torch.int64, device=valid.device)
        cu[1:] = torch.cumsum(lengths, dim=0)
        slots = torch.arange(width, device=valid.device)
        gather = torch.minimum(cu[:-1, None] + slots[None, :], (cu[-1:] - 1).clamp(min=0))
        rows = torch.nonzero(valid.flatten()).squeeze(1)
        return cls(lengths=lengths, cu_seqlens=cu.to(torch.int32), positions=rows % width,
                   segment_ids=segment_ids.flatten().to(torch.int32)[rows], gather=gather,
                   valid=valid, rows=rows, prefill_cu_seqlens=cu.to(torch.int32),
                   mode=MaskMode(mode))

    @property
    def request_major(self) -> bool:
        """Request b's slots are rows ``[b * Lmax, (b + 1) * Lmax)`` (``static=True``)."""
        return self.seq_lens is not None

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """``[B, Lmax, ...]`` -> ``[T, ...]`` (the valid slots, request by request; every slot,
        as a view, when request-major)."""
        if self.request_major:
            return padded.flatten(0, 1)
        return padded.flatten(0, 1)[self.rows]

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """``[T, ...]`` -> ``[B, Lmax, ...]``; padding slots hold copies of other rows (their
        own rows when request-major, a view)."""
        if self.request_major:
            return packed.unflatten(0, tuple(self.valid.shape))
        return packed[self.gather]

    def last_rows(self) -> torch.Tensor:
        """``[B]`` packed row of each request's last token."""
        if self.request_major:
            return (self.cu_seqlens[:-1] + self.seq_lens).to(torch.int64) - 1
        return self.cu_seqlens[1:].to(torch.int64) - 1

    def padded_segments(self) -> torch.Tensor:
        """``[B, Lmax]`` int32 segment ids with ``PAD_SEGMENT`` on padding."""
        seg = self.unpack(self.segment_ids)
        return torch.where(self.valid, seg, torch.full_like(seg, PAD_SEGMENT))


@dataclass
class SharedKV:
    """Per-layer packed prompt keys and values ``[T, Hkv, D]``; written once by prefill.
    ``packed``: when set, ``[layers, 2, T, Hkv, D]`` whose ``[i, 0]`` and ``[i, 1]`` are
    layer i's keys and values (``CachedPrefix.store`` then copies it whole, no concatenation
    first)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    packed: torch.Tensor | None = None


class BeamKV:
    """Per-beam KV of the generated tokens, ``[B, W, slots, layers, Hkv, D]`` keys and values.

    Beam-major: the slots a beam has written, across all layers, are one contiguous run, so the
    reorder after a level moves whole runs (one row gather and one copy back) instead of
    gathering ``[Hkv, D]`` pieces per layer. Never zero-filled: decode step s writes slot s of
    every beam before any read, and reads only slots 0..s.
    """

    def __init__(self, layers: int, batch: int, width: int, slots: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (batch, width, max(slots, 1), layers, kv_heads, head_dim)
        self.keys = torch.empty(shape, dtype=dtype, device=device)
        self.values = torch.empty(shape, dtype=dtype, device=device)

    def slot(self, layer: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[B, W, Hkv, D]`` of one layer's ``slot`` (views to write into)."""
        return self.keys[:, :, slot, layer], self.values[:, :, slot, layer]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[B, W, slots, Hkv, D]`` of one layer (views)."""
        return self.keys[:, :, :, layer], self.values[:, :, :, layer]

    def reorder(self, parents: torch.Tensor, used_slots: int) -> None:
        """Give beam w the KV of beam ``parents[b, w]`` for the first ``used_slots`` slots.

        parents: ``[B, W]`` int64. Copies ``used_slots`` tokens per beam and layer.
        """
        if used_slots == 0:
            return
        batch, width = parents.shape
        flat = (parents + torch.arange(batch, device=parents.device)[:, None] * width).flatten()
        for buffer in (self.keys, self.values):
            per_slot = buffer.shape[3:].numel()                   # layers x Hkv x D
            runs = buffer.view(batch * width, -1)[:, :used_slots * per_slot]
            # Moved as 8-byte words where the runs allow it: the copy back into the strided
            # runs takes the element-wise path, with 4x fewer elements than 16-bit values.
            if (runs.shape[1] * runs.element_size()) % 8 == 0:
                runs = runs.view(torch.int64)
            runs.copy_(runs.index_select(0, flat))


@dataclass(frozen=True)
class CachedPrefix:
    """The first tokens of each request, already in the prompt cache's pages
    (``torch_engine.prompt_cache``): the batch's prompts are their suffixes.

    pool: ``[layers, 2, pages + 1, page_tokens, Hkv, D]`` (keys, values); block_table: ``[B,
    P]`` int32 pages of each request; lengths: ``[B]`` int64 cached tokens of each request
    (its suffix starts at that position); longest: ``max(lengths)`` as a host int (sizes the
    torch path's gather), or None for the whole block table (a traced program, whose
    lengths the host never reads); write_slots: ``[B, Lsuffix]`` int64 flat pool slot (of
    one layer's keys) that each suffix slot's KV is copied to after prefill (the sink's for
    slots not kept), or None.
    """

    pool: torch.Tensor
    block_table: torch.Tensor
    lengths: torch.Tensor
    longest: int | None
    write_slots: torch.Tensor | None = None

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[pages + 1, page_tokens, Hkv, D]`` of one layer (views)."""
        return self.pool[index, 0], self.pool[index, 1]

    def gathered(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer's cached keys and values as padded rows ``[B, C, Hkv, D]`` and their
        ``valid [B, C]`` (``C`` covers ``longest``): the plain-torch path's copy."""
        page_tokens = self.pool.shape[3]
        table = self.block_table.long()
        if self.longest is not None:
            table = table[:, :max(-(-self.longest // page_tokens), 1)]
        keys, values = self.layer(index)
        k, v = keys[table].flatten(1, 2), values[table].flatten(1, 2)
        slots = torch.arange(k.shape[1], device=k.device)
        return k, v, slots[None, :] < self.lengths[:, None]

    def store(self, shared: SharedKV, slots: torch.Tensor) -> None:
        """Copy the prompt KV (per layer ``[T, Hkv, D]``) to flat pool ``slots [T]`` of every
        layer's keys and values: fixed-shape ``index_put_`` writes, no host decision, into
        the pool itself, not a view of it: a traced program then updates its pool input in
        place. (Inductor before torch 2.13 compiles a write into a view or slice of an
        input as a copy of the whole input, twice the pool's memory and two passes over it
        per call.) With ``shared.packed``, one write of the whole buffer; without it (a
        traced program), one write a layer's keys or values, from where they are: gathering
        every layer into one buffer first costs a copy of each."""
        page_tokens = self.pool.shape[3]
        if shared.packed is None:
            page, token = slots // page_tokens, slots % page_tokens
            for index, pair in enumerate(zip(shared.keys, shared.values)):
                for half, kv in enumerate(pair):
                    at = (page.new_full((1,), index), page.new_full((1,), half), page, token)
                    self.pool.index_put_(at, kv.to(self.pool.dtype))
            return
        layers = self.pool.shape[0]
        kv = shared.packed.flatten(0, 2).to(self.pool.dtype)     # [layers * 2 * T, Hkv, D]
        # The index of each row of kv along the pool's first four dimensions: rows run over
        # (layer, keys or values, slot).
        pairs = torch.arange(layers * 2, device=slots.device)[:, None].expand(-1, slots.shape[0])
        layer, half = (pairs // 2).reshape(-1), (pairs % 2).reshape(-1)
        page = (slots // page_tokens).repeat(layers * 2)
        token = (slots % page_tokens).repeat(layers * 2)
        self.pool.index_put_((layer, half, page, token), kv)
