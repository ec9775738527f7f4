"""The paged KV pool on the engine's device, and the bookkeeping of its pages.

Storage is one tensor ``[layers, 2, pages + 1, page_tokens, Hkv, D]`` allocated once. Page 0
is the sink: rows a batch must not keep (padding, tokens past the frozen part) are written
there, so the write after prefill (``kv_cache.CachedPrefix.store``) is one fixed-shape
``index_put_`` into the whole pool, without a host decision per row. Pages are shared between
entries (a common prefix) and freed when their last holder lets go.
"""

from __future__ import annotations

import torch

from torch_engine.prompt_cache.config import KVGeometry
from xgr_common.errors import CapacityError, require

SINK = 0


class PageTable:
    """Free pages and reference counts of pages ``1..pages`` (host bookkeeping only)."""

    def __init__(self, pages: int) -> None:
        self.pages = pages
        self._free = list(range(pages, 0, -1))
        self._refs = [0] * (pages + 1)

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.pages - len(self._free)

    def take(self, count: int) -> list[int] | None:
        """``count`` fresh pages (one reference each), or None when fewer are free."""
        if count > len(self._free):
            return None
        taken = [self._free.pop() for _ in range(count)]
        for page in taken:
            self._refs[page] = 1
        return taken

    def share(self, pages: list[int]) -> None:
        for page in pages:
            require(self._refs[page] > 0, CapacityError, f"page {page} is not held")
            self._refs[page] += 1

    def release(self, pages: list[int]) -> None:
        for page in pages:
            require(self._refs[page] > 0, CapacityError, f"page {page} released twice")
            self._refs[page] -= 1
            if self._refs[page] == 0:
                self._free.append(page)


class KVPool:
    """The device storage of the cached KV."""

    def __init__(self, geometry: KVGeometry, pages: int, page_tokens: int,
                 device: torch.device) -> None:
        g = geometry
        self.geometry, self.page_tokens, self.device = g, page_tokens, torch.device(device)
        self.data = torch.zeros((g.layers, 2, pages + 1, page_tokens, g.kv_heads, g.head_dim),
                                dtype=g.dtype, device=device)
        self.table = PageTable(pages)

    @property
    def pages(self) -> int:
        return self.table.pages

    def read(self, pages: list[int], length: int) -> torch.Tensor:
        """The first ``length`` tokens of ``pages`` as ``[layers, 2, length, Hkv, D]``."""
        index = torch.tensor(pages, dtype=torch.int64, device=self.device)
        rows = self.data.index_select(2, index).flatten(2, 3)
        return rows[:, :, :length]

    def load(self, pages: list[int], kv: torch.Tensor) -> None:
        """Write ``kv [layers, 2, n, Hkv, D]`` (any device) into the first ``n`` tokens of
        ``pages``."""
        pt, n = self.page_tokens, kv.shape[2]
        for i, page in enumerate(pages):
            lo, hi = i * pt, min((i + 1) * pt, n)
            if lo >= hi:
                break
            self.data[:, :, page, :hi - lo].copy_(kv[:, :, lo:hi], non_blocking=True)

    def copy_head(self, source: int, target: int, count: int) -> None:
        """The first ``count`` tokens of page ``source`` into page ``target``."""
        self.data[:, :, target, :count].copy_(self.data[:, :, source, :count])
