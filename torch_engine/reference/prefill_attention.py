"""Reference segmented-mask prefill attention over a packed (ragged) batch.

Packed layout: the prompts of a batch are concatenated along the token axis, request ``b``
occupying rows ``cu_seqlens[b]:cu_seqlens[b+1]``; there is no padding.
"""

from __future__ import annotations

import math

import torch

from xgr_common.layout import MaskMode


def request_mask(segment_ids: torch.Tensor, mode: MaskMode) -> torch.Tensor:
    """The ``[L, L]`` boolean mask (True = may attend) of one request; reference only.

    segment_ids: ``[L]`` int, contiguous and non-decreasing (see ``xgr_common.layout``).
    """
    length = segment_ids.shape[0]
    pos = torch.arange(length, device=segment_ids.device)
    causal = pos[None, :] <= pos[:, None]
    same = segment_ids[None, :] == segment_ids[:, None]
    mode = MaskMode(mode)
    if mode is MaskMode.CAUSAL:
        return causal
    if mode is MaskMode.PREFIX_BIDIRECTIONAL:
        profile = segment_ids == 0
        return causal | (profile[None, :] & profile[:, None])
    if mode is MaskMode.SEGMENT_BIDIRECTIONAL:
        return same
    return causal | same  # ITEM_CAUSAL


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      cu_seqlens: torch.Tensor, segment_ids: torch.Tensor,
                      mode: MaskMode = MaskMode.ITEM_CAUSAL,
                      scale: float | None = None) -> torch.Tensor:
    """Masked attention of each packed request over itself.

    q: ``[T, Hq, D]``; k, v: ``[T, Hkv, D]`` with ``Hq % Hkv == 0`` (GQA);
    cu_seqlens: ``[B+1]`` int32/int64, ``cu_seqlens[0] == 0``, ``cu_seqlens[-1] == T``;
    segment_ids: ``[T]`` int32 (packed like q). Returns ``[T, Hq, D]`` in ``q.dtype``.
    """
    total, hq, dim = q.shape
    group = hq // k.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        qs = q[start:end].to(work).transpose(0, 1)                       # [Hq, L, D]
        ks = k[start:end].to(work).repeat_interleave(group, 1).transpose(0, 1)
        vs = v[start:end].to(work).repeat_interleave(group, 1).transpose(0, 1)
        scores = (qs @ ks.transpose(1, 2)) * scale                       # [Hq, L, L]
        mask = request_mask(segment_ids[start:end], mode)
        scores = scores.masked_fill(~mask, float("-inf"))
        out[start:end] = (torch.softmax(scores, dim=-1) @ vs).transpose(0, 1).to(q.dtype)
    return out
