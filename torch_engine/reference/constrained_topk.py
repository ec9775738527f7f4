"""Plain-torch reference of one constrained beam-search level (``xgr::constrained_topk``).

For request b, beam w and code c of the level's codebook (size C):

    logp[b, w, c]  = logits[b, w, c] - logsumexp(logits[b, w, allowed(prefix[b, w])])
                     for c allowed after the beam's prefix (CSR tables of ``catalog``), else -inf
    total[b, w, c] = scores[b, w] + logp[b, w, c]   (-inf too when the child path is blocked)

The softmax is normalised over the *allowed* codes only, as ``beam_search.constrain``.
Selection rule (the kernel follows it bit for bit): candidates are ordered by total score
descending, ties by flat index ``w * C + c`` ascending; the first ``width`` are kept and then
returned in flat-index order, i.e. sorted by parent beam and, within a parent, by code. Scores
are compared through ``sortable_keys`` (the IEEE order as int32; -0.0 sorts just below +0.0).
When fewer than ``width`` candidates are finite, every finite one comes first (in flat-index
order) and the tail holds -inf candidates, the first in flat-index order: the live beams of a
level whose continuations all fit occupy the first slots, in prefix order.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def sortable_keys(values: torch.Tensor) -> torch.Tensor:
    """int32 keys whose integer order is the float order of fp32 ``values``."""
    bits = values.contiguous().view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def masked_level_scores(logits: torch.Tensor, scores: torch.Tensor, prefixes: torch.Tensor,
                        indptr: torch.Tensor, codes: torch.Tensor,
                        blocked: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Candidate totals ``[B, W, C]`` float32 and their child prefix ids ``[B, W, C]`` int64
    (the CSR entry, -1 where not allowed). ``blocked``: ``[B, X]`` child ids to drop."""
    batch, width, size = logits.shape
    x = logits.float()
    start = indptr[prefixes]
    count = indptr[prefixes + 1] - start
    most = int(count.max()) if count.numel() else 0
    slot = torch.arange(most, device=logits.device)
    entry = start[..., None] + slot
    ok = slot < count[..., None]
    code = torch.where(ok, codes[torch.where(ok, entry, 0)], size)        # C = dump column
    child = torch.full((batch, width, size + 1), -1, dtype=torch.int64, device=logits.device)
    child = child.scatter(2, code, torch.where(ok, entry, -1))[..., :size]
    allowed = child >= 0
    lse = torch.logsumexp(x.masked_fill(~allowed, NEG_INF), dim=-1, keepdim=True)
    total = torch.where(allowed, scores.float()[..., None] + (x - lse), NEG_INF)
    if blocked is not None:
        hit = (child.flatten(1)[:, :, None] == blocked[:, None, :]).any(-1)
        total = total.masked_fill(hit.view_as(total) & allowed, NEG_INF)
    return total, child


def constrained_topk(logits: torch.Tensor, scores: torch.Tensor, prefixes: torch.Tensor,
                     indptr: torch.Tensor, codes: torch.Tensor, width: int,
                     blocked: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One level of constrained beam search.

    logits: ``[B, W, C]`` fp32/bf16/fp16 over the level's codebook; scores: ``[B, W]`` float32
    running log-probabilities (-inf = dead beam); prefixes: ``[B, W]`` int64 prefix ids;
    indptr ``[P + 1]``, codes ``[E]``: the level's CSR (``catalog.level_indptr[l]``,
    ``level_codes[l]``); width: beams kept, ``1 <= width <= W * C``; blocked: optional
    ``[B, X]`` int64 child prefix ids whose candidates are dropped (padding: any id >= E).

    Returns scores ``[B, width]`` float32, parent ``[B, width]`` int64, code ``[B, width]``
    int64 and prefix ``[B, width]`` int64 (next prefix id; 0 for a not-allowed candidate), in
    the order of the module docstring.
    """
    batch, beams, size = logits.shape
    total, child = masked_level_scores(logits, scores, prefixes, indptr, codes, blocked)
    flat = total.flatten(1)
    # A stable descending sort keeps equal keys in flat-index order: the tie rule.
    order = torch.sort(sortable_keys(flat), dim=1, descending=True, stable=True).indices
    chosen = order[:, :width]
    dead = torch.isneginf(flat.gather(1, chosen))
    # Flat-index order, -inf picks after the finite ones (both keep flat order).
    chosen = chosen.gather(1, (chosen + dead * flat.shape[1]).sort(dim=1).indices)
    best = flat.gather(1, chosen)
    prefix = child.flatten(1).gather(1, chosen).clamp(min=0)
    return best, chosen // size, chosen % size, prefix
