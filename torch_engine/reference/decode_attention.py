"""Reference xAttention for one decode step: W beams over a shared prompt plus their own tokens.

Definition (``decode_attention``): each beam's query attends the concatenation of its request's
shared prompt KV and the beam's first ``num_own`` own KV slots. The three-stage form that the
kernels implement (shared part once for all beams, each beam's own part, log-sum-exp merge) is
given by ``attend_with_lse`` and ``merge_states``; both forms agree up to rounding.
"""

from __future__ import annotations

import math

import torch


def attend_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention returning the output and its log-sum-exp.

    q: ``[..., Hq, M, D]``; k, v: ``[..., Hq, N, D]`` (already expanded to Hq heads).
    Returns out ``[..., Hq, M, D]`` and lse ``[..., Hq, M]`` (natural log), in float32/64.
    """
    scores = (q @ k.transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse


def merge_states(out_a: torch.Tensor, lse_a: torch.Tensor,
                 out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Merge two partial attention results over disjoint key sets by their log-sum-exps."""
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse)[..., None] + out_b * torch.exp(lse_b - lse)[..., None]


def decode_attention(q: torch.Tensor, shared_k: torch.Tensor, shared_v: torch.Tensor,
                     cu_seqlens: torch.Tensor, beam_k: torch.Tensor, beam_v: torch.Tensor,
                     num_own: int, scale: float | None = None,
                     seq_lens: torch.Tensor | None = None) -> torch.Tensor:
    """One decode step of W beams per request.

    q: ``[B, W, Hq, D]`` (the current token of each beam);
    shared_k, shared_v: ``[T, Hkv, D]`` packed prompt KV, request b at
    ``cu_seqlens[b]:cu_seqlens[b+1]``, or at ``cu_seqlens[b]:cu_seqlens[b] + seq_lens[b]`` when
    ``seq_lens`` is given (request-major packing); beam_k, beam_v: ``[B, W, S, Hkv, D]``
    per-beam KV whose first ``num_own`` slots are valid (the current token's KV included);
    ``0 <= num_own <= S`` (0: the prompt alone; each request then needs at least one prompt
    token).
    Returns ``[B, W, Hq, D]`` in ``q.dtype``.
    """
    batch, width, hq, dim = q.shape
    group = hq // shared_k.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    out = torch.empty_like(q)
    starts = cu_seqlens.tolist()
    ends = starts[1:] if seq_lens is None else [s + n for s, n in zip(starts, seq_lens.tolist())]
    for b in range(batch):
        qb = q[b].to(work).permute(1, 0, 2)                               # [Hq, W, D]
        sk = shared_k[starts[b]:ends[b]].to(work).repeat_interleave(group, 1)
        sv = shared_v[starts[b]:ends[b]].to(work).repeat_interleave(group, 1)
        ok = beam_k[b, :, :num_own].to(work).repeat_interleave(group, 2)  # [W, n, Hq, D]
        ov = beam_v[b, :, :num_own].to(work).repeat_interleave(group, 2)
        # Keys of beam w: the shared prompt followed by its own tokens.
        keys = torch.cat([sk[None].expand(width, -1, -1, -1), ok], dim=1).permute(2, 0, 1, 3)
        vals = torch.cat([sv[None].expand(width, -1, -1, -1), ov], dim=1).permute(2, 0, 1, 3)
        scores = (qb[:, :, None, :] @ keys.transpose(-1, -2)).squeeze(2) * scale  # [Hq, W, N]
        probs = torch.softmax(scores, dim=-1)
        out[b] = (probs[:, :, None, :] @ vals).squeeze(2).permute(1, 0, 2).to(q.dtype)
    return out
