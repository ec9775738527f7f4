"""The semantic-ID catalog and its device constraint tables, built once with vectorised NumPy.

Items are sorted by code path (then item id). A *prefix of length l* is a distinct tuple of the
first l codes; prefixes of each length are numbered in sorted order, so prefix 0 of length 0 is
the root and the full-length prefixes are the catalog's distinct paths. For each level l:

    level_indptr[l]  [P_l + 1]      CSR over prefixes of length l
    level_codes[l]   [P_{l+1}]      the allowed next code of each CSR entry
    level_parents[l] [P_{l+1}]      the length-l prefix each entry extends

Entry e of level l's CSR *is* prefix e of length l+1 (the children of a prefix are contiguous
in sorted order), so beam search carries prefix ids instead of code tuples. Then

    path_indptr [P_L + 1], path_items [N]   the items of each path, sorted by item id
    item_lookup_ids [N], item_lookup_rows [N]  sorted item ids and their row in path_items
    prefix_indptr[l] [P_{l+1} + 1]  for l < L - 1: the rows of path_items under each prefix of
                                    length l + 1 (``item_indptr`` also gives path_indptr)

A catalog *padded* to a ``CatalogCapacity`` (``Catalog.padded``) has tables of the capacity's
sizes, so that a program traced on it serves any catalog within the capacity: its ints are the
capacities, and its real counts live in ``live`` (host) and ``live_prefixes`` (device). Padding
is inert: an empty prefix repeats the last ``indptr`` value, so no real prefix reaches a padded
CSR entry or path; padded lookup ids are ``PAD_ID`` (above every item id) with the row sentinel
(``num_items``), so an exclusion of that id excludes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from xgr_common.errors import CatalogError, require
from xgr_common.layout import TokenLayout


# Padded entries of the sorted item ids: larger than any item id, so they sort last.
PAD_ID = 2 ** 63 - 1


@dataclass(frozen=True)
class CatalogSize:
    """A catalog's sizes, or the capacities a padded catalog's tables are built to: ``items``;
    ``prefixes`` of each length 1..L (P_L = distinct paths); ``fanout`` per level (most
    children of one prefix); ``items_per_path``."""

    items: int
    prefixes: tuple[int, ...]
    fanout: tuple[int, ...]
    items_per_path: int

    def __post_init__(self) -> None:
        require(len(self.prefixes) == len(self.fanout) >= 1, CatalogError,
                f"prefixes {self.prefixes} and fanout {self.fanout} need one entry per level")
        values = (self.items, *self.prefixes, *self.fanout, self.items_per_path)
        require(all(isinstance(v, int) and v >= 1 for v in values), CatalogError,
                f"catalog sizes must be positive ints, got {self}")

    @classmethod
    def with_headroom(cls, size: "CatalogSize", headroom: float, codebook_size: int
                      ) -> "CatalogSize":
        """``size`` grown by ``headroom`` (1.5 = half again), within what ``codebook_size``
        codes per level allow."""
        require(headroom >= 1.0, CatalogError, f"headroom must be >= 1.0, got {headroom}")
        grow = lambda n: int(math.ceil(n * headroom))  # noqa: E731
        prefixes = tuple(min(grow(p), codebook_size ** (length + 1))
                         for length, p in enumerate(size.prefixes))
        return cls(items=grow(size.items), prefixes=prefixes,
                   fanout=tuple(min(grow(f), codebook_size) for f in size.fanout),
                   items_per_path=grow(size.items_per_path))

    def over(self, capacity: "CatalogSize") -> list[str]:
        """Each size above ``capacity``, as "name value > capacity" (empty: it fits)."""
        over = []
        pairs = [("items", self.items, capacity.items),
                 ("items_per_path", self.items_per_path, capacity.items_per_path)]
        pairs += [(f"prefixes of length {i + 1}", v, c)
                  for i, (v, c) in enumerate(zip(self.prefixes, capacity.prefixes))]
        pairs += [(f"fanout of level {i}", v, c)
                  for i, (v, c) in enumerate(zip(self.fanout, capacity.fanout))]
        for name, value, cap in pairs:
            if value > cap:
                over.append(f"{name} {value} > {cap}")
        return over

    def to_json(self) -> dict:
        return {"items": self.items, "prefixes": list(self.prefixes),
                "fanout": list(self.fanout), "items_per_path": self.items_per_path}

    @classmethod
    def from_json(cls, data: dict) -> "CatalogSize":
        try:
            return cls(items=int(data["items"]), prefixes=tuple(int(p) for p in data["prefixes"]),
                       fanout=tuple(int(f) for f in data["fanout"]),
                       items_per_path=int(data["items_per_path"]))
        except (KeyError, TypeError, ValueError) as error:
            raise CatalogError(f"a catalog capacity needs items, prefixes, fanout and "
                               f"items_per_path; got {data!r} ({error})") from None


@dataclass(frozen=True)
class Catalog:
    """Device tables of one catalog (all int64 tensors); build with ``Catalog.from_arrays``,
    pad to capacities with ``padded``."""

    layout: TokenLayout
    num_items: int
    num_prefixes: tuple[int, ...]      # P_0 = 1, P_1, ..., P_L (P_L = distinct paths)
    max_fanout: tuple[int, ...]        # per level: most children of one prefix
    max_items_per_path: int
    level_indptr: tuple[torch.Tensor, ...]
    level_codes: tuple[torch.Tensor, ...]
    level_parents: tuple[torch.Tensor, ...]
    path_indptr: torch.Tensor
    path_items: torch.Tensor
    item_lookup_ids: torch.Tensor
    item_lookup_rows: torch.Tensor
    prefix_indptr: tuple[torch.Tensor, ...]   # lengths 1 .. L-1; length L is path_indptr
    # Padded catalogs only: the real sizes, and the real prefix counts P_0..P_L on the device.
    live: CatalogSize | None = None
    live_prefixes: torch.Tensor | None = None

    @classmethod
    def from_arrays(cls, item_ids, codes, layout: TokenLayout | None = None) -> "Catalog":
        """Build from ``item_ids`` int64 ``[N]`` (unique) and ``codes`` int ``[N, levels]``.

        Several items may share a path. Raises ``CatalogError`` naming the rule broken.
        Accepts NumPy arrays or CPU tensors.
        """
        layout = layout or TokenLayout()
        ids = np.asarray(item_ids.cpu() if isinstance(item_ids, torch.Tensor) else item_ids)
        paths = np.asarray(codes.cpu() if isinstance(codes, torch.Tensor) else codes)
        ids = ids.astype(np.int64, copy=False) if np.issubdtype(ids.dtype, np.integer) else ids
        by_id = _check_arrays(ids, paths, layout)
        levels, size, count = layout.levels, layout.codebook_size, ids.shape[0]
        # One int64 key per path (codes as digits in base codebook_size). Sorting by (key, item
        # id) as one int64 (key * N + rank of the id) is several times faster than lexsort.
        key = np.zeros(count, dtype=np.int64)
        for level in range(levels):
            key = key * size + paths[:, level].astype(np.int64)
        if float(size) ** levels * count < 2.0 ** 62:
            id_rank = np.empty(count, dtype=np.int64)
            id_rank[by_id] = np.arange(count, dtype=np.int64)
            order = _argsort(key * count + id_rank)
        else:
            order = np.lexsort((ids, key))
        key_sorted = key[order]
        # starts[l]: first sorted row of each prefix of length l (l = 0..levels).
        starts = [np.zeros(1, dtype=np.int64)]
        for length in range(1, levels + 1):
            prefix = key_sorted // size ** (levels - length)
            starts.append(np.flatnonzero(np.r_[True, prefix[1:] != prefix[:-1]]).astype(np.int64))
        level_indptr, level_codes, level_parents, fanout = [], [], [], []
        for level in range(levels):
            # Parent of each child = the length-l prefix containing the child's first row.
            parent = np.searchsorted(starts[level], starts[level + 1], side="right") - 1
            counts = np.bincount(parent, minlength=starts[level].shape[0])
            level_indptr.append(np.r_[0, np.cumsum(counts)].astype(np.int64))
            digit = (key_sorted[starts[level + 1]] // size ** (levels - 1 - level)) % size
            level_codes.append(digit.astype(np.int64))
            level_parents.append(parent.astype(np.int64))
            fanout.append(int(counts.max()))
        path_indptr = np.r_[starts[levels], ids.shape[0]].astype(np.int64)
        row_of_item = np.empty_like(order)
        row_of_item[order] = np.arange(order.shape[0], dtype=order.dtype)
        as_tensor = torch.from_numpy
        return cls(
            layout=layout,
            num_items=int(ids.shape[0]),
            num_prefixes=tuple(int(s.shape[0]) for s in starts),
            max_fanout=tuple(fanout),
            max_items_per_path=int(np.diff(path_indptr).max()),
            level_indptr=tuple(as_tensor(a) for a in level_indptr),
            level_codes=tuple(as_tensor(a) for a in level_codes),
            level_parents=tuple(as_tensor(a) for a in level_parents),
            path_indptr=as_tensor(path_indptr),
            path_items=as_tensor(ids[order]),
            item_lookup_ids=as_tensor(ids[by_id]),
            item_lookup_rows=as_tensor(row_of_item[by_id].astype(np.int64)),
            prefix_indptr=tuple(as_tensor(np.r_[starts[length], count].astype(np.int64))
                                for length in range(1, levels)),
        )

    @property
    def levels(self) -> int:
        return self.layout.levels

    @property
    def size(self) -> CatalogSize:
        """The real sizes (of the items in hand, also when the tables are padded)."""
        return self.live or self.table_size

    @property
    def table_size(self) -> CatalogSize:
        """The sizes the tables are built to: the capacity of a padded catalog."""
        return CatalogSize(items=self.num_items, prefixes=self.num_prefixes[1:],
                           fanout=self.max_fanout, items_per_path=self.max_items_per_path)

    def reachable_items(self, beam_width: int) -> int:
        """The most items ``beam_width`` final beams can reach, the bound on ``top_k``: beam
        search returns only items on surviving code paths, each path holds at most
        ``max_items_per_path`` items, and there are ``num_items`` in all (the real counts)."""
        size = self.size
        return min(size.items, beam_width * size.items_per_path)

    def padded(self, capacity: CatalogSize) -> "Catalog":
        """This catalog with tables padded to ``capacity`` (see the module docstring); raises
        ``CatalogError`` naming each size over its capacity. A catalog already padded to
        ``capacity`` is returned as it is."""
        if self.live is not None and self.table_size == capacity:
            return self
        real = self.size
        require(len(capacity.prefixes) == self.levels, CatalogError,
                f"the capacity names {len(capacity.prefixes)} levels, the catalog has "
                f"{self.levels}")
        over = real.over(capacity)
        require(not over, CatalogError,
                f"the catalog is over the capacity its package was exported with: "
                f"{'; '.join(over)}. Export a package with a larger capacity")
        source = self.to("cpu") if self.live is None else self.unpadded().to("cpu")
        levels, sentinel = self.levels, capacity.items
        counts = (1, *capacity.prefixes)

        def grow(t: torch.Tensor, size: int, fill: int | None = None) -> torch.Tensor:
            value = int(t[-1]) if fill is None else fill
            return torch.cat([t, t.new_full((size - t.shape[0],), value)])

        level_indptr = tuple(grow(source.level_indptr[l], counts[l] + 1) for l in range(levels))
        level_codes = tuple(grow(source.level_codes[l], counts[l + 1], 0) for l in range(levels))
        level_parents = tuple(grow(source.level_parents[l], counts[l + 1], 0)
                              for l in range(levels))
        padded = replace(
            source, num_items=capacity.items, num_prefixes=counts, max_fanout=capacity.fanout,
            max_items_per_path=capacity.items_per_path, level_indptr=level_indptr,
            level_codes=level_codes, level_parents=level_parents,
            path_indptr=grow(source.path_indptr, counts[levels] + 1),
            path_items=grow(source.path_items, sentinel, -1),
            item_lookup_ids=grow(source.item_lookup_ids, sentinel, PAD_ID),
            item_lookup_rows=grow(source.item_lookup_rows, sentinel, sentinel),
            prefix_indptr=tuple(grow(t, counts[l + 1] + 1)
                                for l, t in enumerate(source.prefix_indptr)),
            live=real,
            live_prefixes=torch.tensor((1, *real.prefixes), dtype=torch.int64))
        return padded.to(self.device)

    def unpadded(self) -> "Catalog":
        """The catalog's tables at its real sizes (itself when not padded)."""
        if self.live is None:
            return self
        real, levels = self.live, self.levels
        counts = (1, *real.prefixes)
        return replace(
            self, num_items=real.items, num_prefixes=counts, max_fanout=real.fanout,
            max_items_per_path=real.items_per_path,
            level_indptr=tuple(self.level_indptr[l][:counts[l] + 1] for l in range(levels)),
            level_codes=tuple(self.level_codes[l][:counts[l + 1]] for l in range(levels)),
            level_parents=tuple(self.level_parents[l][:counts[l + 1]] for l in range(levels)),
            path_indptr=self.path_indptr[:counts[levels] + 1],
            path_items=self.path_items[:real.items],
            item_lookup_ids=self.item_lookup_ids[:real.items],
            item_lookup_rows=self.item_lookup_rows[:real.items],
            prefix_indptr=tuple(t[:counts[l + 1] + 1] for l, t in enumerate(self.prefix_indptr)),
            live=None, live_prefixes=None)

    def item_indptr(self, length: int) -> torch.Tensor:
        """``[P_length + 1]`` int64: prefix p of ``length`` codes (1..levels) holds the rows
        ``indptr[p]:indptr[p + 1]`` of ``path_items`` (sorted order keeps them contiguous)."""
        require(1 <= length <= self.levels, CatalogError,
                f"prefix length must be in [1, {self.levels}], got {length}")
        return self.path_indptr if length == self.levels else self.prefix_indptr[length - 1]

    @property
    def device(self) -> torch.device:
        return self.path_items.device

    def to(self, device: torch.device | str) -> "Catalog":
        """A copy whose tables live on ``device``."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                moved[f.name] = value.to(device)
            elif isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
                moved[f.name] = tuple(t.to(device) for t in value)
        return replace(self, **moved)

    def nbytes(self) -> int:
        """Bytes held by the tables."""
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every table by a stable name (``level_codes.0``, ``path_items``, ...)."""
        named = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                named[f.name] = value
            elif isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
                named.update({f"{f.name}.{i}": t for i, t in enumerate(value)})
        return named

    def with_tensors(self, named: dict[str, torch.Tensor]) -> "Catalog":
        """A catalog of the same sizes over the tables ``named`` (as ``tensors`` names them)."""
        changes = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                changes[f.name] = named[f.name]
            elif isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor):
                changes[f.name] = tuple(named[f"{f.name}.{i}"] for i in range(len(value)))
        return replace(self, **changes)


def _argsort(values: np.ndarray) -> np.ndarray:
    """Argsort of unique int64 values; torch's CPU sort is faster than NumPy's on large
    arrays."""
    return torch.sort(torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
                      ).indices.numpy()


def _check_arrays(ids: np.ndarray, paths: np.ndarray, layout: TokenLayout) -> np.ndarray:
    """Raise CatalogError on a malformed catalog; returns the argsort of ``ids``."""
    require(ids.ndim == 1 and ids.shape[0] >= 1, CatalogError,
            f"item_ids must be a non-empty 1-D array, got shape {ids.shape}")
    require(np.issubdtype(ids.dtype, np.integer), CatalogError,
            f"item_ids must be integers, got dtype {ids.dtype}")
    require(paths.ndim == 2 and paths.shape == (ids.shape[0], layout.levels), CatalogError,
            f"codes must have shape [N={ids.shape[0]}, levels={layout.levels}], "
            f"got {paths.shape}")
    require(np.issubdtype(paths.dtype, np.integer), CatalogError,
            f"codes must be integers, got dtype {paths.dtype}")
    require(float(layout.codebook_size) ** layout.levels < 2.0 ** 62, CatalogError,
            f"codebook_size**levels = {layout.codebook_size}**{layout.levels} must fit int64")
    low, high = int(paths.min()), int(paths.max())
    require(low >= 0 and high < layout.codebook_size, CatalogError,
            f"codes must lie in [0, codebook_size={layout.codebook_size}), got [{low}, {high}]")
    require(int(ids.min()) >= 0, CatalogError,
            f"item_ids must be >= 0 (-1 marks 'no item' in results), got {int(ids.min())}")
    by_id = _argsort(ids)
    sorted_ids = ids[by_id]
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    require(dup.shape[0] == 0, CatalogError,
            f"item_ids must be unique; {dup.shape[0]} duplicates, e.g. "
            f"{sorted_ids[dup[:3]].tolist() if dup.shape[0] else []}")
    return by_id
