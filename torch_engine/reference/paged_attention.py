"""Reference attention over cached pages: the prefill of a prompt's suffix and one decode step
when the prompt's first tokens come from the prompt cache.

Paged layout: ``pool_k, pool_v [pages, page_tokens, Hkv, D]``; request b's cached tokens are
the first ``cached_lens[b]`` tokens of pages ``block_table[b, 0], block_table[b, 1], ...``.
Cached tokens precede the suffix and every query may attend all of them (the prompt cache
keeps only frozen parts, which end where the mask rules let every later token see them).
"""

from __future__ import annotations

import math

import torch

from torch_engine.reference.decode_attention import decode_attention
from torch_engine.reference.prefill_attention import request_mask
from xgr_common.layout import MaskMode


def gather_pages(pool: torch.Tensor, pages: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens ``[length, Hkv, D]`` of ``pages`` (1-D) in ``pool``."""
    count = -(-length // pool.shape[1])
    return pool[pages[:count].long()].flatten(0, 1)[:length]


def paged_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            cu_seqlens: torch.Tensor, segment_ids: torch.Tensor,
                            mode: MaskMode, pool_k: torch.Tensor, pool_v: torch.Tensor,
                            block_table: torch.Tensor, cached_lens: torch.Tensor,
                            scale: float | None = None,
                            seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """Each packed suffix request attends its cached tokens and itself under ``mode``.

    q: ``[T, Hq, D]``; k, v: ``[T, Hkv, D]`` (the suffixes, packed like ``prefill_attention``;
    request-major when ``seq_lens`` is given); segment_ids ``[T]``; block_table ``[B, P]``;
    cached_lens ``[B]``. Returns ``[T, Hq, D]`` in ``q.dtype``.
    """
    hq, dim = q.shape[1], q.shape[2]
    group = hq // k.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.zeros_like(q)
    starts = cu_seqlens.tolist()
    ends = starts[1:] if seq_lens is None else [s + n for s, n in zip(starts, seq_lens.tolist())]
    for b, cached in enumerate(cached_lens.tolist()):
        lo, hi = starts[b], ends[b]
        if hi == lo:
            continue
        ck = gather_pages(pool_k, block_table[b], cached).to(work)
        cv = gather_pages(pool_v, block_table[b], cached).to(work)
        keys = torch.cat([ck, k[lo:hi].to(work)]).repeat_interleave(group, 1).transpose(0, 1)
        vals = torch.cat([cv, v[lo:hi].to(work)]).repeat_interleave(group, 1).transpose(0, 1)
        qs = q[lo:hi].to(work).transpose(0, 1)                            # [Hq, n, D]
        scores = (qs @ keys.transpose(1, 2)) * scale                      # [Hq, n, c + n]
        own = request_mask(segment_ids[lo:hi], mode)
        mask = torch.cat([torch.ones((hi - lo, cached), dtype=torch.bool, device=q.device),
                          own], dim=1)
        scores = scores.masked_fill(~mask, float("-inf"))
        out[lo:hi] = (torch.softmax(scores, dim=-1) @ vals).transpose(0, 1).to(q.dtype)
    return out


def paged_decode_attention(q: torch.Tensor, shared_k: torch.Tensor, shared_v: torch.Tensor,
                           cu_seqlens: torch.Tensor, pool_k: torch.Tensor,
                           pool_v: torch.Tensor, block_table: torch.Tensor,
                           cached_lens: torch.Tensor, beam_k: torch.Tensor,
                           beam_v: torch.Tensor, num_own: int, scale: float | None = None,
                           seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """One decode step whose shared stage covers each request's cached tokens, then its
    suffix (``shared_k, shared_v``, packed as in ``decode_attention``), then each beam's own
    first ``num_own`` slots. Shapes as ``decode_attention``; returns ``[B, W, Hq, D]``."""
    starts = cu_seqlens.tolist()
    ends = starts[1:] if seq_lens is None else [s + n for s, n in zip(starts, seq_lens.tolist())]
    keys, vals, offsets = [], [], [0]
    for b, cached in enumerate(cached_lens.tolist()):
        keys += [gather_pages(pool_k, block_table[b], cached).to(q.dtype),
                 shared_k[starts[b]:ends[b]].to(q.dtype)]
        vals += [gather_pages(pool_v, block_table[b], cached).to(q.dtype),
                 shared_v[starts[b]:ends[b]].to(q.dtype)]
        offsets.append(offsets[-1] + cached + ends[b] - starts[b])
    cu = torch.tensor(offsets, dtype=torch.int64, device=q.device)
    return decode_attention(q, torch.cat(keys), torch.cat(vals), cu,
                            beam_k, beam_v, num_own, scale)
