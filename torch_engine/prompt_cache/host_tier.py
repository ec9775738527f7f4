"""The host-RAM tier: entries evicted from the device pool, kept in (pinned) host memory.

A hit here copies the entry back into device pages (``PromptCache`` does it) and leaves this
tier. Least recently stored goes first when the byte budget is full.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass
class HostRecord:
    """One entry's KV ``[layers, 2, length, Hkv, D]`` on the host, with its boundaries and
    their digests (ascending)."""

    kv: torch.Tensor
    boundaries: list[int]
    digests: list[bytes]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


class HostTier:
    """Records by digest within ``budget`` bytes."""

    def __init__(self, budget: int, pinned: bool) -> None:
        self.budget, self.pinned = budget, pinned
        self.used = 0
        self._records: OrderedDict[int, HostRecord] = OrderedDict()
        self._index: dict[bytes, tuple[HostRecord, int]] = {}

    def __len__(self) -> int:
        return len(self._records)

    def put(self, kv: torch.Tensor, boundaries: list[int], digests: list[bytes]) -> bool:
        """Keep a copy of ``kv`` (device tensor, copied here) under ``digests``; False when it
        does not fit the budget even after dropping older records."""
        nbytes = kv.numel() * kv.element_size()
        if nbytes > self.budget:
            return False
        while self.used + nbytes > self.budget:
            self._drop(next(iter(self._records.values())))
        host = torch.empty(kv.shape, dtype=kv.dtype, device="cpu", pin_memory=self.pinned)
        host.copy_(kv)
        record = HostRecord(host, list(boundaries), list(digests))
        self._records[id(record)] = record
        self.used += nbytes
        for n, digest in zip(boundaries, digests):
            self._index.setdefault(digest, (record, n))
        return True

    def longest(self, digests: list[bytes]) -> tuple[HostRecord, int] | None:
        """The record holding the longest of these prefixes, and its length."""
        for digest in reversed(digests):
            found = self._index.get(digest)
            if found is not None:
                return found
        return None

    def take(self, record: HostRecord) -> None:
        """Remove ``record`` (it moved back to the device)."""
        self._drop(record)

    def clear(self) -> None:
        self._records.clear()
        self._index.clear()
        self.used = 0

    def _drop(self, record: HostRecord) -> None:
        self._records.pop(id(record), None)
        self.used -= record.nbytes
        for digest in record.digests:
            if self._index.get(digest, (None,))[0] is record:
                del self._index[digest]
