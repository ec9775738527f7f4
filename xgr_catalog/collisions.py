"""Collisions: at most ``cap`` items on one code path, every item kept on a path of its own
neighbourhood.

Residual k-means gives near-identical items the same path; the engine returns every item of
each path its beams reach, so one crowded path crowds out the rest of a top-k and its last
items may never be returned. ``cap_paths`` keeps on each path the ``cap`` items nearest to the
path's reconstruction and moves each other one (an *overflow* item) to its next-nearest
last-level code under the same prefix, in rounds:

1. round t offers every waiting item its t-th nearest last-level code (its own code left
   out), among the ``candidates`` nearest;
2. a path with room takes the arrivals nearest to its last centroid until it holds ``cap``;
   the rest wait for round t + 1.

Items still waiting after ``candidates`` rounds (their prefix is full: more than ``cap x
codebook_size`` items under it) are placed one by one, greedily from the first level: at each
level the nearest code whose subtree still has room. The subtree of a prefix of length l holds
at most ``cap x codebook_size ** (levels - l)`` items and the catalog at most ``cap x
codebook_size ** levels``, so a subtree with room always has a child with room: every item gets
a path, none over its cap.

The rounds run in torch on the codes' device; the greedy placement runs on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from xgr_catalog.kmeans import partial_residual
from xgr_common.errors import ConfigError, require


@dataclass(frozen=True)
class CapResult:
    """The capped codes ``[N, levels]`` int64 (on the input codes' device) and what moved:
    ``items_over_cap`` items on ``paths_over_cap`` crowded paths (the most items on one path
    was ``max_items_per_path_before``); ``moved_next_code`` of them took a next-nearest
    last-level code, ``moved_greedy`` a path found greedily from the first level;
    ``added_error``: the mean squared reconstruction error the moves added, over all items;
    ``rounds``: rounds of next-nearest codes used."""

    codes: torch.Tensor
    items_over_cap: int
    paths_over_cap: int
    max_items_per_path_before: int
    moved_next_code: int
    moved_greedy: int
    added_error: float
    rounds: int

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in (
            "items_over_cap", "paths_over_cap", "max_items_per_path_before", "moved_next_code",
            "moved_greedy", "added_error", "rounds")}


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
    item's squared residual norm under ``codes``, which orders the items of a crowded path.
    Computes on the codebooks' device; the codes come back where they were."""
    levels, size = codebooks.shape[0], codebooks.shape[1]
    count = codes.shape[0]
    require(isinstance(cap, int) and cap >= 1, ConfigError,
            f"the cap on items per path must be a positive int, got {cap!r}")
    require(float(size) ** levels < 2.0 ** 62, ConfigError,
            f"codebook_size ** levels = {size} ** {levels} must stay below 2**62 (one int64 "
            f"key per path, as the engine's catalog tables need)")
    require(count <= cap * size ** levels, ConfigError,
            f"{count} items cannot fit {size} ** {levels} paths of at most {cap} items "
            f"(max_items_per_path); raise max_items_per_path, codebook_size or levels")
    device = codebooks.device
    home = codes.device
    work = codes.to(device).clone()
    errors = item_errors.to(device)
    key = path_keys(work, size)
    order, rank, distinct, counts = _rank_in_group(key, errors)
    over = rank >= cap
    overflow = order[over].sort().values
    before = int(counts.max())
    stats = {"items_over_cap": int(overflow.shape[0]),
             "paths_over_cap": int((counts > cap).sum()), "max_items_per_path_before": before}
    if overflow.shape[0] == 0:
        return CapResult(codes=codes, moved_next_code=0, moved_greedy=0, added_error=0.0,
                         rounds=0, **stats)
    occupied_keys, occupied = distinct, counts.clamp(max=cap)
    added = torch.zeros((), dtype=torch.float64, device=device)
    width = min(size - 1, candidates)
    waiting = torch.arange(overflow.shape[0], device=device)
    rounds = 0
    if width >= 1:
        near_codes, near_dist = _next_nearest(points, codebooks, work, overflow, width, chunk)
        prefix = key[overflow] // size
        with tqdm(total=int(overflow.shape[0]), desc="collisions (next-nearest code)",
                  unit="item", disable=not progress) as bar:
            for step in range(width):
                if waiting.shape[0] == 0:
                    break
                rounds = step + 1
                code, dist = near_codes[waiting, step], near_dist[waiting, step]
                want = prefix[waiting] * size + code
                slot = torch.searchsorted(occupied_keys, want).clamp(
                    max=occupied_keys.shape[0] - 1)
                found = occupied_keys[slot] == want
                held = torch.where(found, occupied[slot], torch.zeros_like(slot))
                order, rank, _, _ = _rank_in_group(want, dist)
                taken = torch.zeros_like(found)
                taken[order] = held[order] + rank < cap
                items = overflow[waiting[taken]]
                work[items, levels - 1] = code[taken]
                added += (dist[taken].double() - errors[items].double()).sum()
                occupied.index_add_(0, slot[taken & found],
                                    torch.ones_like(slot[taken & found]))
                fresh, fresh_counts = torch.unique(want[taken & ~found], return_counts=True)
                if fresh.shape[0]:
                    occupied_keys, by_key = torch.sort(torch.cat([occupied_keys, fresh]))
                    occupied = torch.cat([occupied, fresh_counts])[by_key]
                waiting = waiting[~taken]
                bar.update(int(taken.sum()))
    moved_next_code = int(overflow.shape[0] - waiting.shape[0])
    if waiting.shape[0]:
        left = overflow[waiting]
        added += _place_greedily(points, codebooks, work, left, errors, cap, progress)
    return CapResult(codes=work.to(home), moved_next_code=moved_next_code,
                     moved_greedy=int(waiting.shape[0]), added_error=float(added) / count,
                     rounds=rounds, **stats)


def _next_nearest(points: torch.Tensor, codebooks: torch.Tensor, codes: torch.Tensor,
                  items: torch.Tensor, width: int, chunk: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``width`` nearest last-level codes ``[m, width]`` of each item (its own code left
    out) and their squared distances from the item's last-level residual (the item's squared
    reconstruction error on that code), nearest first."""
    last = codebooks.shape[0] - 1
    centroids = codebooks[last]
    norms = (centroids * centroids).sum(dim=1)
    codes_out, dist_out = [], []
    for start in range(0, items.shape[0], chunk):
        index = items[start:start + chunk]
        rows = points[index.to(points.device)].to(codebooks.device)
        own = codes[index]
        residual = partial_residual(rows, codebooks, own, last)
        dist = torch.addmm(norms[None, :], residual, centroids.T, alpha=-2.0)
        dist += (residual * residual).sum(dim=1, keepdim=True)
        dist.scatter_(1, own[:, last:last + 1], float("inf"))
        nearest = torch.topk(dist, width, dim=1, largest=False, sorted=True)
        codes_out.append(nearest.indices)
        dist_out.append(nearest.values.clamp(min=0.0))
    return torch.cat(codes_out), torch.cat(dist_out)


def _place_greedily(points: torch.Tensor, codebooks: torch.Tensor, codes: torch.Tensor,
                    items: torch.Tensor, errors: torch.Tensor, cap: int,
                    progress: bool = True) -> float:
    """Gives each of ``items`` (in order) the path chosen greedily from the first level: at
    each level the nearest code whose subtree has room; writes ``codes`` in place and returns
    the squared error added (summed)."""
    levels, size = codebooks.shape[0], codebooks.shape[1]
    books = codebooks.double().cpu().numpy()
    all_codes = codes.cpu().numpy()
    moving = items.cpu().numpy()
    staying = np.ones(all_codes.shape[0], dtype=bool)
    staying[moving] = False
    # Per prefix length: the occupancy of every prefix of the items that stay (sorted keys and
    # counts), plus the items placed here (a dict).
    base, placed = [], [dict() for _ in range(levels)]
    key = np.zeros(all_codes.shape[0], dtype=np.int64)
    for level in range(levels):
        key = key * size + all_codes[:, level]
        base.append(np.unique(key[staying], return_counts=True))
    room = [cap * size ** (levels - 1 - level) for level in range(levels)]

    def held(level: int, prefix: int) -> int:
        keys, counts = base[level]
        at = int(np.searchsorted(keys, prefix))
        found = int(counts[at]) if at < keys.shape[0] and keys[at] == prefix else 0
        return found + placed[level].get(prefix, 0)

    rows = points[items.to(points.device)].double().cpu().numpy()
    before = errors[items.to(errors.device)].double().cpu().numpy()
    added = 0.0
    for item, row, error in tqdm(zip(moving, rows, before), total=moving.shape[0],
                                 desc="collisions (greedy path)", unit="item",
                                 disable=not progress):
        residual, prefix, path = row, 0, []
        for level in range(levels):
            dist = ((books[level] - residual) ** 2).sum(axis=1)
            for code in np.argsort(dist, kind="stable"):
                if held(level, prefix * size + int(code)) < room[level]:
                    break
            else:  # unreachable while the catalog fits its capacity (checked by the caller)
                raise AssertionError("no code with room: the capacity check was bypassed")
            prefix = prefix * size + int(code)
            path.append(int(code))
            residual = residual - books[level][code]
        prefix = 0
        for level, code in enumerate(path):
            prefix = prefix * size + code
            placed[level][prefix] = placed[level].get(prefix, 0) + 1
        all_codes[item] = path
        added += float((residual * residual).sum()) - float(error)
    codes.copy_(torch.from_numpy(all_codes).to(codes.device))
    return added
