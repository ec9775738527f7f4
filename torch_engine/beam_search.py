"""Device-side constrained beam search over code levels, and the final path -> item expansion.

Everything here is tensor code with shapes fixed by the catalog, the beam width and top_k:
no host reads, no data-dependent Python branches, so a decode loop over the (few) levels
traces and captures.

Beam state between levels: ``scores [B, W]`` float32 (sum of per-level log-probabilities,
-inf for dead beams) and ``prefixes [B, W]`` int64 (prefix id of each beam, see ``catalog``).
"""

from __future__ import annotations

import importlib
import os

import torch

from torch_engine.attention import _kernel
from torch_engine.catalog import Catalog
from xgr_common.errors import ConfigError, require

NEG_INF = float("-inf")


def resolve_selection(name: str, device: torch.device) -> str:
    """"torch" (``constrain`` + ``rank``/``keep_all``) or "triton" (the fused
    ``xgr::constrained_topk``) for the configured ``name`` ("auto", "torch", "triton").
    "auto" picks triton on CUDA only; "triton" also runs on the CPU under TRITON_INTERPRET=1."""
    kernel = _kernel("constrained_topk") is not None
    if name == "auto":
        return "triton" if kernel and device.type == "cuda" else "torch"
    if name == "triton":
        usable = device.type == "cuda" or os.environ.get("TRITON_INTERPRET", "0") == "1"
        require(kernel and usable, ConfigError,
                f"selection_backend='triton' needs CUDA (or TRITON_INTERPRET=1) and "
                f"torch_engine.kernels.constrained_topk (device is {device}, kernel importable: "
                f"{kernel})")
    return name


def select_fused(logits: torch.Tensor, scores: torch.Tensor, prefixes: torch.Tensor,
                 catalog: Catalog, level: int, width: int, blocked: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``constrain`` + ``rank`` (+ ``drop_exhausted`` via ``blocked``, see
    ``exhausted_prefixes``) in one Triton op. Returns parents, codes, new prefixes and scores
    ``[B, width]`` like ``rank``, but ordered by (parent, code) instead of by score."""
    new, parents, codes, children = _kernel("constrained_topk")(
        logits, scores, prefixes, catalog.level_indptr[level], catalog.level_codes[level],
        width, blocked)
    return parents, codes, children, new


def fused_exclusion_tables(catalog: Catalog):
    """The catalog tables the fused selection's exclusion kernels read
    (``torch_engine.kernels.exclusions.ExclusionTables``), built once per engine."""
    return _exclusion_kernels().ExclusionTables.of(catalog)


def _exclusion_kernels():
    # Imported on use: Triton is needed only with the fused selection.
    return importlib.import_module("torch_engine.kernels.exclusions")


def _torch_only(tables) -> bool:
    """Plain torch when there are no kernel tables, or while tracing under the Triton
    interpreter (interpreted kernels cannot be traced)."""
    return tables is None or (torch.compiler.is_compiling() and
                              os.environ.get("TRITON_INTERPRET", "0") == "1")


def excluded_rows_of(exclude_items: torch.Tensor, catalog: Catalog, tables
                     ) -> torch.Tensor:
    """``excluded_rows``, in one Triton launch when ``tables`` (``fused_exclusion_tables``)
    are given (as the op ``xgr::excluded_rows`` while tracing)."""
    if _torch_only(tables):
        return excluded_rows(exclude_items, catalog)
    kernels = _exclusion_kernels()
    run = (kernels.traced_excluded_rows if torch.compiler.is_compiling()
           else kernels.excluded_rows)
    return run(exclude_items.contiguous(), tables)


def blocked_prefixes(excluded: torch.Tensor, catalog: Catalog, tables
                     ) -> tuple[torch.Tensor, ...]:
    """``exhausted_prefixes`` of every level (the fused selection's ``blocked`` inputs), in
    one Triton launch when ``tables`` are given."""
    if _torch_only(tables):
        return tuple(exhausted_prefixes(excluded, catalog, level)
                     for level in range(catalog.levels))
    kernels = _exclusion_kernels()
    run = (kernels.traced_exhausted_prefixes if torch.compiler.is_compiling()
           else kernels.exhausted_prefixes)
    return run(excluded, tables).unbind(0)


def expand_items_of(scores: torch.Tensor, paths: torch.Tensor, excluded: torch.Tensor,
                    catalog: Catalog, top_k: int, tables
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``expand_items``, in one Triton launch on the fused path (``tables`` given, as for
    ``excluded_rows_of``; for beams that one program sorts: ``item_expansion.MAX_BEAMS``)."""
    if not _torch_only(tables):
        kernels = importlib.import_module("torch_engine.kernels.item_expansion")
        if scores.shape[1] <= kernels.MAX_BEAMS:
            run = (kernels.traced_expand_items if torch.compiler.is_compiling()
                   else kernels.expand_items)
            return run(scores.contiguous(), paths.contiguous(), excluded,
                       catalog.path_indptr, catalog.path_items, top_k)
    return expand_items(scores, paths, excluded, catalog, top_k)


def constrain(logits: torch.Tensor, prefixes: torch.Tensor, catalog: Catalog, level: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-softmax over each beam's *allowed* next codes.

    logits: ``[B, W, C]`` float32 over ``level``'s codebook; prefixes: ``[B, W]`` int64.
    Returns logp ``[B, W, C]`` (-inf where not allowed; the softmax is normalised over the
    allowed codes only) and child ``[B, W, C]`` int64 (the next prefix id, -1 if not allowed).
    """
    indptr, codes = catalog.level_indptr[level], catalog.level_codes[level]
    size = logits.shape[-1]
    start = indptr[prefixes]
    count = indptr[prefixes + 1] - start
    slot = torch.arange(catalog.max_fanout[level], device=logits.device)
    entry = start[..., None] + slot                                   # [B, W, M] CSR entries
    ok = slot < count[..., None]
    code = torch.where(ok, codes[torch.where(ok, entry, 0)], size)    # C = a dump column
    child = torch.full((*prefixes.shape, size + 1), -1, dtype=torch.int64,
                       device=logits.device)
    child = child.scatter(2, code, torch.where(ok, entry, -1))[..., :size]
    allowed = child >= 0
    masked = logits.masked_fill(~allowed, NEG_INF)
    lse = torch.logsumexp(masked, dim=-1, keepdim=True)
    return torch.where(allowed, logits - lse, NEG_INF), child


def rank(scores: torch.Tensor, logp: torch.Tensor, child: torch.Tensor, width: int
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Best ``width`` (beam, code) continuations per request.

    scores: ``[B, W0]``; logp, child: ``[B, W0, C]``. Returns parents ``[B, width]``, codes,
    new prefix ids (0 for dead beams) and new scores (descending), all ``[B, width]``.
    """
    size = logp.shape[-1]
    total = (scores[..., None] + logp).flatten(1)
    best, index = torch.topk(total, width, dim=1)
    prefixes = child.flatten(1).gather(1, index).clamp(min=0)
    return index // size, index % size, prefixes, best


def keep_all(scores: torch.Tensor, logp: torch.Tensor, catalog: Catalog, level: int,
             width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every next prefix in catalog order, with no ranking: for a level whose prefixes all fit
    the beam (``num_prefixes[level + 1] <= width``), which implies beam slot p holds prefix p.

    Same outputs as ``rank`` (scores not sorted; slots past the last prefix are dead).
    """
    count = catalog.num_prefixes[level + 1]
    device = scores.device
    parents = torch.zeros(width, dtype=torch.int64, device=device)
    codes = torch.zeros(width, dtype=torch.int64, device=device)
    parents[:count] = catalog.level_parents[level]
    codes[:count] = catalog.level_codes[level]
    # A padded catalog's table holds ``count`` entries, of which the first live_prefixes are
    # real: a tensor, so the traced search serves every catalog within the capacity.
    real = count if catalog.live_prefixes is None else catalog.live_prefixes[level + 1]
    live = torch.arange(width, device=device) < real
    batch = scores.shape[0]
    parents, codes = parents.expand(batch, width), codes.expand(batch, width)
    step = logp.gather(1, parents[..., None].expand(-1, -1, logp.shape[-1]))
    step = step.gather(2, codes[..., None])[..., 0]
    new = torch.where(live, scores.gather(1, parents) + step, NEG_INF)
    prefixes = torch.where(live, torch.arange(width, device=device), 0).expand(batch, width)
    return parents, codes, prefixes, new


def excluded_rows(exclude_items: torch.Tensor, catalog: Catalog) -> torch.Tensor:
    """Rows of ``path_items`` holding each request's excluded items, sorted, deduplicated.

    exclude_items: ``[B, X]`` int64 with X >= 1, -1 = padding; ids not in the catalog are
    ignored.
    Returns ``[B, X]`` int64 with the sentinel ``num_items`` for padding/unknown/duplicates.
    """
    ids, rows = catalog.item_lookup_ids, catalog.item_lookup_rows
    pos = torch.searchsorted(ids, exclude_items).clamp(max=ids.shape[0] - 1)
    found = (ids[pos] == exclude_items) & (exclude_items >= 0)
    sentinel = catalog.num_items
    out = torch.where(found, rows[pos], sentinel).sort(dim=1).values
    # Each entry against its left neighbour through a gather, not shifted slices: slices of
    # X - 1 columns make torch.export assume X - 1 >= 2 (it specialises sizes 0 and 1), so a
    # dynamic X would only export for X >= 3.
    column = torch.arange(out.shape[1], device=out.device)
    left = out.gather(1, (column - 1).clamp(min=0).expand_as(out))
    duplicate = (out == left) & (column > 0)
    return torch.where(duplicate, sentinel, out).sort(dim=1).values


def drop_exhausted(logp: torch.Tensor, child: torch.Tensor, excluded: torch.Tensor,
                   catalog: Catalog, level: int) -> torch.Tensor:
    """Set logp to -inf for children (prefixes of ``level + 1`` codes) all of whose items are
    excluded: a beam spent there could never yield an item.

    child: ``[B, W, C]`` from ``constrain``; excluded: ``[B, X]`` sorted rows from
    ``excluded_rows`` (deduplicated, so counting the excluded rows inside a child's row range
    tells whether it is covered). Returns logp ``[B, W, C]``.
    """
    indptr = catalog.item_indptr(level + 1)
    flat = child.flatten(1).clamp(min=0)
    lo, hi = indptr[flat], indptr[flat + 1]
    hits = torch.searchsorted(excluded, hi) - torch.searchsorted(excluded, lo)
    return logp.masked_fill((hits >= hi - lo).view_as(logp), NEG_INF)


def exhausted_prefixes(excluded: torch.Tensor, catalog: Catalog, level: int) -> torch.Tensor:
    """Prefixes of ``level + 1`` codes all of whose items are excluded, for the fused
    selection's ``blocked`` input at ``level``.

    excluded: ``[B, X]`` sorted rows from ``excluded_rows``. Returns ``[B, X]`` int64 prefix
    ids sorted ascending, padded with ``num_prefixes[level + 1]`` (no prefix has that id).
    Same prefixes as ``drop_exhausted`` drops, without a ``[B, W, C]`` pass.
    """
    indptr = catalog.item_indptr(level + 1)
    total = catalog.num_prefixes[level + 1]
    known = excluded < catalog.num_items
    prefix_of = torch.searchsorted(indptr, excluded, right=True) - 1
    prefix_of = torch.where(known, prefix_of, total)                  # sorted along rows
    hits = (torch.searchsorted(prefix_of, prefix_of, right=True)
            - torch.searchsorted(prefix_of, prefix_of, right=False))
    first = prefix_of.clamp(max=total - 1)
    sizes = indptr[first + 1] - indptr[first]
    return torch.where(known & (hits >= sizes), prefix_of, total).sort(dim=1).values


def expand_items(scores: torch.Tensor, paths: torch.Tensor, excluded: torch.Tensor,
                 catalog: Catalog, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``top_k`` best items of the final beams.

    scores, paths: ``[B, W]`` final beams (any order); excluded: ``[B, X]`` sorted rows
    (``excluded_rows``, X >= 1).
    Items of a path share its score and follow each other by item id. Returns item ids
    ``[B, top_k]`` int64 (-1 where fewer items were reachable) and scores float32 (-inf there).
    """
    batch, width = scores.shape
    scores, order = torch.sort(scores, dim=1, descending=True, stable=True)
    paths = paths.gather(1, order)
    first = catalog.path_indptr[paths]
    count = torch.where(scores > NEG_INF, catalog.path_indptr[paths + 1] - first, 0)
    ends = torch.cumsum(count, dim=1)
    # Enough raw slots that top_k survive even if every excluded item falls among them.
    raw = top_k + excluded.shape[1]
    slot = torch.arange(raw, device=scores.device).repeat(batch, 1)
    beam = torch.searchsorted(ends, slot, right=True).clamp(max=width - 1)
    offset = slot - (ends.gather(1, beam) - count.gather(1, beam))
    reachable = slot < ends[:, -1:]
    row = torch.where(reachable, first.gather(1, beam) + offset, 0)
    pos = torch.searchsorted(excluded, row).clamp(max=excluded.shape[1] - 1)
    hit = excluded.gather(1, pos) == row
    keep = reachable & ~hit
    target = torch.cumsum(keep.to(torch.int64), dim=1) - 1
    target = torch.where(keep & (target < top_k), target, top_k)      # top_k = dump column
    items = torch.full((batch, top_k + 1), -1, dtype=torch.int64, device=scores.device)
    items = items.scatter(1, target, catalog.path_items[row])[:, :top_k]
    best = torch.full((batch, top_k + 1), NEG_INF, dtype=torch.float32, device=scores.device)
    best = best.scatter(1, target, scores.gather(1, beam).float())[:, :top_k]
    return items, best
