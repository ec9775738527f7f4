"""Collisions: at most ``cap`` items on one code path, every item kept on a path of its own
neighbourhood.

Residual k-means gives near-identical items the same path; the engine returns every item of
each path its beams reach, so one crowded path crowds out the rest of a top-k and its last
items may never be returned. ``cap_paths`` keeps every path within ``cap`` items, so that every
item stays reachable. Capping the last level alone cannot: thousands of near-duplicates under
one prefix (more than ``cap x codebook_size``) leave no last-level code with room. So the
paths are capped top-down, one level at a time, and a crowded neighbourhood spills into the
nearest subtree with room.

The subtree of a prefix of length ``l + 1`` may hold at most ``cap x codebook_size **
(levels - 1 - l)`` items (its share of the catalog's ``cap x codebook_size ** levels``). For
each level ``l`` from the first, in each prefix that holds more, the items nearest to it
(smallest squared residual after level ``l``; ties by item index) stay and each other one (an
*overflow* item) moves to its next-nearest level-``l`` code under the same length-``l``
prefix, in rounds:

1. round t offers every waiting item its t-th nearest sibling code, from a batch of the
   ``candidates`` nearest (the first batch leaves out the item's own code; a later batch,
   computed only for items still waiting, holds the nearest codes that still have room: every
   code offered before is full);
2. a code with room takes the arrivals nearest to it until its subtree is full; the rest wait
   for round t + 1.

A moved item's deeper codes are encoded again (nearest code per level from its new
residual), and the next level's pass caps them. Level ``l - 1`` left at most ``codebook_size``
subtrees' worth of items under each length-``l`` prefix, so a waiting item always finds a code
with room: every item gets a path, none over its cap. When the cap binds only at the last level
this is one pass of next-nearest last-level codes.

Everything runs in torch on the codebooks' device, on the overflow items only, with distances
computed ``chunk`` rows at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm import tqdm

from xgr_catalog.kmeans import partial_residual
from xgr_common.errors import ConfigError, require


@dataclass(frozen=True)
class CapResult:
    """The capped codes ``[N, levels]`` int64 (on the input codes' device) and what moved:
    ``items_over_cap`` items on ``paths_over_cap`` crowded paths before capping (the most
    items on one path was ``max_items_per_path_before``); ``moved_per_level[l]``: moves to a
    next-nearest level-``l`` code (an item moved at one level may move again deeper);
    ``added_error``: the mean squared reconstruction error the moves added, over all items;
    ``rounds``: rounds of next-nearest codes used, over all levels."""

    codes: torch.Tensor
    items_over_cap: int
    paths_over_cap: int
    max_items_per_path_before: int
    moved_per_level: tuple[int, ...]
    added_error: float
    rounds: int

    @property
    def moved_next_code(self) -> int:
        """Moves to a next-nearest last-level code."""
        return self.moved_per_level[-1]

    def to_json(self) -> dict:
        return {"items_over_cap": self.items_over_cap, "paths_over_cap": self.paths_over_cap,
                "max_items_per_path_before": self.max_items_per_path_before,
                "moved_per_level": list(self.moved_per_level),
                "moved_next_code": self.moved_next_code, "added_error": self.added_error,
                "rounds": self.rounds}


class _Siblings:
    """Runtime state of one level's pass: the ``overflow`` items ``[m]`` (ascending) that
    leave a full subtree, the row of ``table`` holding their parent prefix (``parent_row
    [m]``), and ``table [parents, codebook_size]``: the items each child of those parents
    holds, updated as items arrive."""

    def __init__(self, overflow: torch.Tensor, parent_row: torch.Tensor, table: torch.Tensor,
                 capacity: int):
        self.overflow, self.parent_row, self.table = overflow, parent_row, table
        self.capacity = capacity

    def full(self, positions: torch.Tensor) -> torch.Tensor:
        """``[len(positions), codebook_size]`` bool: which children of each overflow item's
        parent are full."""
        return self.table[self.parent_row[positions]] >= self.capacity


def path_keys(codes: torch.Tensor, codebook_size: int, length: int | None = None
              ) -> torch.Tensor:
    """One int64 per item for its first ``length`` codes (default all), the codes read as
    digits in base ``codebook_size``."""
    length = codes.shape[1] if length is None else length
    key = torch.zeros(codes.shape[0], dtype=torch.int64, device=codes.device)
    for level in range(length):
        key = key * codebook_size + codes[:, level]
    return key


def _rank_in_group(keys: torch.Tensor, order_first_by: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows grouped by ``keys``, ordered by ``order_first_by`` inside a group (stable sorts):
    (order, rank of each sorted row inside its group, the distinct keys, their counts)."""
    order = torch.sort(order_first_by, stable=True).indices
    order = order[torch.sort(keys[order], stable=True).indices]
    distinct, counts = torch.unique_consecutive(keys[order], return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.shape[0], device=keys.device) - torch.repeat_interleave(starts,
                                                                                     counts)
    return order, rank, distinct, counts


def cap_paths(points: torch.Tensor, codebooks: torch.Tensor, codes: torch.Tensor,
              item_errors: torch.Tensor, cap: int, candidates: int = 64, chunk: int = 65_536,
              progress: bool = True) -> CapResult:
    """``codes [N, levels]`` (int64) of ``points [N, d]`` under ``codebooks [levels, K, d]``
    with at most ``cap`` items a path (see the module docstring). ``item_errors [N]``: each
    item's squared residual norm under ``codes``, the baseline of ``added_error``. Computes on
    the codebooks' device; the codes come back where they were."""
    levels, size = codebooks.shape[0], codebooks.shape[1]
    count = codes.shape[0]
    require(isinstance(cap, int) and cap >= 1, ConfigError,
            f"the cap on items per path must be a positive int, got {cap!r}")
    require(isinstance(candidates, int) and candidates >= 1, ConfigError,
            f"candidates must be a positive int, got {candidates!r}")
    require(float(size) ** levels < 2.0 ** 62, ConfigError,
            f"codebook_size ** levels = {size} ** {levels} must stay below 2**62 (one int64 "
            f"key per path, as the engine's catalog tables need)")
    require(count <= cap * size ** levels, ConfigError,
            f"{count} items cannot fit {size} ** {levels} paths of at most {cap} items "
            f"(max_items_per_path); raise max_items_per_path, codebook_size or levels")
    device = codebooks.device
    work = codes.to(device=device, dtype=torch.int64, copy=True)
    stats = _crowding(work, size, cap)
    if stats["items_over_cap"] == 0:    # no path over the cap: no subtree over its share
        return CapResult(codes=codes, moved_per_level=(0,) * levels, added_error=0.0,
                         rounds=0, **stats)
    moved = torch.zeros(count, dtype=torch.bool, device=device)
    moves, rounds = [], 0
    for level in range(levels):
        siblings = _overflow(points, codebooks, work, level, cap, chunk)
        with tqdm(total=int(siblings.overflow.shape[0]), unit="item", disable=not progress,
                  desc=f"collisions (level {level + 1} of {levels})") as bar:
            rounds += _move_to_siblings(points, codebooks, work, level, siblings, candidates,
                                        chunk, bar)
        if level < levels - 1:
            _encode_below(points, codebooks, work, siblings.overflow, level, chunk)
        moved[siblings.overflow] = True
        moves.append(int(siblings.overflow.shape[0]))
    touched = torch.nonzero(moved).flatten()
    after = _squared_residuals(points, codebooks, work, touched, levels, chunk)
    added = (after.double() - item_errors.to(device)[touched].double()).sum()
    return CapResult(codes=work.to(codes.device), moved_per_level=tuple(moves),
                     added_error=float(added) / count, rounds=rounds, **stats)


def _crowding(codes: torch.Tensor, size: int, cap: int) -> dict:
    """Items over the cap, paths over it and the most items on one path, before capping."""
    _, counts = torch.unique(path_keys(codes, size), return_counts=True)
    return {"items_over_cap": int((counts - cap).clamp(min=0).sum()),
            "paths_over_cap": int((counts > cap).sum()),
            "max_items_per_path_before": int(counts.max())}


def _overflow(points: torch.Tensor, codebooks: torch.Tensor, codes: torch.Tensor, level: int,
              cap: int, chunk: int) -> _Siblings:
    """The items that leave the length-``level + 1`` prefixes holding more than their share
    (those farthest from it after ``level``), and the occupancy of their parents' children."""
    levels, size = codebooks.shape[0], codebooks.shape[1]
    capacity = cap * size ** (levels - 1 - level)
    key = path_keys(codes, size, level + 1)
    distinct, counts = torch.unique(key, return_counts=True)
    crowded = distinct[counts > capacity]
    members = torch.nonzero(torch.isin(key, crowded)).flatten()
    errors = _squared_residuals(points, codebooks, codes, members, level + 1, chunk)
    order, rank, _, _ = _rank_in_group(key[members], errors)
    overflow = members[order[rank >= capacity]].sort().values
    # Each child of a parent the overflow leaves keeps at most its capacity.
    parents = torch.unique(key[overflow] // size)
    under = torch.isin(distinct // size, parents)
    cells = torch.searchsorted(parents, distinct[under] // size) * size + distinct[under] % size
    table = torch.zeros(parents.shape[0] * size, dtype=torch.int64, device=key.device)
    table[cells] = counts[under].clamp(max=capacity)
    parent_row = torch.searchsorted(parents, key[overflow] // size)
    return _Siblings(overflow, parent_row, table.view(-1, size), capacity)


def _move_to_siblings(points: torch.Tensor, codebooks: torch.Tensor, codes: torch.Tensor,
                      level: int, siblings: _Siblings, candidates: int, chunk: int,
                      bar: tqdm) -> int:
    """Gives every overflow item a level-``level`` code with room, nearest first in rounds
    (see the module docstring); writes ``codes`` in place and returns the rounds used."""
    size = codebooks.shape[1]
    width = min(size - 1, candidates)
    waiting = torch.arange(siblings.overflow.shape[0], device=codes.device)
    rounds, first = 0, True
    while waiting.shape[0]:
        near_codes, near_dist = _nearest_siblings(points, codebooks, codes, siblings, waiting,
                                                  level, width, first, chunk)
        if not bool(torch.isfinite(near_dist[:, 0]).all()):
            raise AssertionError(   # the previous level left room for every item: a bug
                f"level {level}: an item's parent prefix has no child with room; the "
                f"capacity of its subtree was exceeded")
        rows = torch.arange(waiting.shape[0], device=codes.device)
        for step in range(width):
            dist = near_dist[rows, step]
            offered = torch.isfinite(dist)
            if not bool(offered.any()):
                break
            rounds += 1
            code = near_codes[rows, step].long()
            cell = siblings.parent_row[waiting] * size + code
            held = torch.where(offered, siblings.table.view(-1)[cell],
                               torch.full_like(cell, siblings.capacity))
            order, rank, _, _ = _rank_in_group(cell, dist)
            taken = torch.zeros_like(offered)
            taken[order] = held[order] + rank < siblings.capacity
            codes[siblings.overflow[waiting[taken]], level] = code[taken]
            siblings.table.view(-1).index_add_(0, cell[taken], torch.ones_like(cell[taken]))
            bar.update(int(taken.sum()))
            waiting, rows = waiting[~taken], rows[~taken]
            if not waiting.shape[0]:
                break
        first = False
    return rounds


def _nearest_siblings(points: torch.Tensor, codebooks: torch.Tensor, codes: torch.Tensor,
                      siblings: _Siblings, waiting: torch.Tensor, level: int, width: int,
                      first: bool, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``width`` nearest level-``level`` codes ``[m, width]`` (int32) of the waiting
    overflow items and their squared distances from each item's residual before ``level``
    (inf where no code is left), nearest first. The first batch leaves out the item's own
    code; a later one every full code (those offered before among them)."""
    centroids = codebooks[level]
    norms = (centroids * centroids).sum(dim=1)
    codes_out, dist_out = [], []
    for start in range(0, waiting.shape[0], chunk):
        positions = waiting[start:start + chunk]
        items = siblings.overflow[positions]
        residual = partial_residual(_rows(points, items, codebooks.device), codebooks,
                                    codes[items], level)
        dist = torch.addmm(norms[None, :], residual, centroids.T, alpha=-2.0)
        dist += (residual * residual).sum(dim=1, keepdim=True)
        if first:
            dist.scatter_(1, codes[items, level:level + 1], float("inf"))
        else:
            dist.masked_fill_(siblings.full(positions), float("inf"))
        nearest = torch.topk(dist, width, dim=1, largest=False, sorted=True)
        codes_out.append(nearest.indices.to(torch.int32))   # half the memory of int64
        dist_out.append(nearest.values.clamp(min=0.0))
    return torch.cat(codes_out), torch.cat(dist_out)


def _encode_below(points: torch.Tensor, codebooks: torch.Tensor, codes: torch.Tensor,
                  items: torch.Tensor, level: int, chunk: int) -> None:
    """Encodes the levels after ``level`` of ``items`` again, nearest code per level from
    the residual their (new) codes up to ``level`` leave; writes ``codes`` in place."""
    norms = (codebooks * codebooks).sum(dim=2)
    for start in range(0, items.shape[0], chunk):
        index = items[start:start + chunk]
        block = codes[index]
        residual = partial_residual(_rows(points, index, codebooks.device), codebooks, block,
                                    level + 1)
        for deeper in range(level + 1, codebooks.shape[0]):
            # |r - c|^2 = |r|^2 - 2 r.c + |c|^2, and |r|^2 does not change the argmin.
            block[:, deeper] = torch.addmm(norms[deeper][None, :], residual,
                                           codebooks[deeper].T, alpha=-2.0).min(dim=1).indices
            residual -= codebooks[deeper][block[:, deeper]]
        codes[index] = block


def _squared_residuals(points: torch.Tensor, codebooks: torch.Tensor, codes: torch.Tensor,
                       items: torch.Tensor, upto: int, chunk: int) -> torch.Tensor:
    """``[len(items)]`` float32: each item's squared residual norm after levels ``0 ..
    upto-1`` of its ``codes``."""
    out = [torch.zeros(0, device=codebooks.device)]
    for start in range(0, items.shape[0], chunk):
        index = items[start:start + chunk]
        residual = partial_residual(_rows(points, index, codebooks.device), codebooks,
                                    codes[index], upto)
        out.append((residual * residual).sum(dim=1))
    return torch.cat(out)


def _rows(points: torch.Tensor, items: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``points[items]`` on ``device`` (the rows may live on the host)."""
    return points[items.to(points.device)].to(device)
