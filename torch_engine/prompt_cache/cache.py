"""``PromptCache``: entries of frozen-prompt KV in a paged device pool, least recently used
evicted to the host tier (or dropped), looked up by content digests.

A batch ``reserve``s its rows before the search (host work: digests, lookups, page
allocation) and ``finish``es after its verdict: with ``keep=True`` the KV its prefill wrote
becomes visible to later requests; with ``keep=False`` (an invalid input, a failed search)
every page it took goes back, so a broken request leaves nothing behind. Until then the
entries it reads are pinned (never evicted) and the pages it writes are its own, so
concurrent requests of one user are safe: the second reads what the first committed, or
computes its own copy.

An entry holds one frozen part's pages and grows in place: a request whose frozen part
extends an entry's (a block closed and joined the long-term part) writes only the new tokens
into that entry's pages. When the entry grew differently meanwhile (another continuation of
the same prefix), the request gets a new entry that shares the common whole pages.

The cache never makes a request fail: when the pool cannot give a row its pages after
evicting everything unpinned, the row runs with what it found (or uncached).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from torch_engine.prompt_cache.config import KVGeometry, PromptCacheConfig
from torch_engine.prompt_cache.host_tier import HostTier
from torch_engine.prompt_cache.keys import (CacheScope, prefix_digest, prefix_digests,
                                            safe_boundaries, token_records)
from torch_engine.prompt_cache.pool import SINK, KVPool
from xgr_common.errors import ConfigError, require

TIERS = ("device", "host", "miss", "uncached", "none")


@dataclass(frozen=True)
class PromptRow:
    """One request's prompt as the cache sees it: ``tokens [L]`` and ``segments [L]`` on the
    host (a causal prompt's from its item starts: ``keys.safe_boundaries``), ``frozen``: the
    frozen part's length (0: nothing to cache), ``length``: the prompt's tokens."""

    tokens: np.ndarray
    segments: np.ndarray
    frozen: int
    length: int = 0


@dataclass(frozen=True)
class RowPlan:
    """What the cache does for one row: ``cached`` tokens read from ``pages`` (the row of
    the block table; it also covers the tokens written), tokens ``[cached, written)`` written
    by the prefill; ``tier``: "device" or "host" (where a hit came from), "miss" (computed and
    stored), "uncached" (the pool had no room), "none" (no frozen part)."""

    cached: int
    written: int
    pages: tuple[int, ...]
    tier: str


@dataclass
class _Entry:
    pages: list[int]
    length: int
    registered: list[bytes] = field(default_factory=list)
    readers: int = 0
    writer: bool = False


@dataclass
class Reservation:
    """One batch's plan: per row a ``RowPlan``; ``finish`` runs ``commits`` or
    ``rollbacks``."""

    plans: list[RowPlan]
    page_tokens: int
    _commits: list = field(default_factory=list)
    _rollbacks: list = field(default_factory=list)
    _readers: list = field(default_factory=list)
    finished: bool = False

    def block_table(self, rows: int | None = None, pages: int | None = None) -> torch.Tensor:
        """``[rows, pages]`` int32 pages of each row on the host (the sink past a row's own
        and on rows past the batch's; defaults: the batch's rows, its widest row)."""
        rows = len(self.plans) if rows is None else rows
        width = max([len(p.pages) for p in self.plans] + [1]) if pages is None else pages
        table = np.full((rows, width), SINK, dtype=np.int32)
        for row, plan in enumerate(self.plans):
            table[row, :len(plan.pages)] = plan.pages[:width]
        return torch.from_numpy(table)

    def cached_lengths(self, rows: int | None = None) -> torch.Tensor:
        """``[rows]`` int64 cached tokens of each row on the host (0 past the batch's)."""
        rows = len(self.plans) if rows is None else rows
        out = np.zeros(rows, dtype=np.int64)
        out[:len(self.plans)] = [p.cached for p in self.plans]
        return torch.from_numpy(out)

    def write_slots(self, width: int, rows: int | None = None) -> torch.Tensor:
        """``[rows, width]`` int64 flat pool slot of each suffix slot on the host (suffix
        slot j of row b is token ``cached + j``): its page slot when the prefill keeps it,
        the sink otherwise (and on rows past the batch's)."""
        pt = self.page_tokens
        rows = len(self.plans) if rows is None else rows
        slots = np.full((rows, width), SINK * pt, dtype=np.int64)
        for row, plan in enumerate(self.plans):
            if plan.written > plan.cached:    # a miss writes thousands: no loop per token
                pos = np.arange(plan.cached, plan.written)
                pages = np.asarray(plan.pages, dtype=np.int64)
                slots[row, :pos.size] = pages[pos // pt] * pt + pos % pt
        return torch.from_numpy(slots)

    def rows(self, rows: list[int]) -> "Reservation":
        """The plans of ``rows`` alone, for the tables of a run of those rows (this
        reservation still finishes the batch)."""
        return Reservation([self.plans[b] for b in rows], self.page_tokens)

    @property
    def writes(self) -> bool:
        """Whether any row writes tokens into the pool."""
        return any(p.written > p.cached for p in self.plans)


@dataclass(frozen=True)
class CacheStats:
    """Counters since the cache was made, and what it holds now."""

    lookups: int
    device_hits: int
    host_hits: int
    partial_hits: int
    misses: int
    uncached: int
    evictions: int
    host_spills: int
    tokens_reused: int
    tokens_written: int
    entries: int
    device_bytes: int
    host_entries: int
    host_bytes: int


class PromptCache:
    """The prompt-KV cache of one model shape on one device (see the module docstring).

    geometry: the KV one token holds (``KVGeometry.of_model``); config: budgets and page
    size; device: where the pool lives. ``scope`` arguments (``keys.scope_of``) decide which
    model's entries a lookup may find.
    """

    def __init__(self, geometry: KVGeometry, config: PromptCacheConfig,
                 device: torch.device | str) -> None:
        page_bytes = geometry.page_bytes(config.page_tokens)
        pages = config.device_bytes // page_bytes
        require(pages >= 1, ConfigError,
                f"PromptCacheConfig.device_bytes {config.device_bytes} holds no page: one page "
                f"of {config.page_tokens} tokens is {page_bytes} bytes at "
                f"{geometry.token_bytes} bytes a token")
        self.geometry, self.config = geometry, config
        self.device = _indexed(torch.device(device))
        self.pool = KVPool(geometry, pages, config.page_tokens, self.device)
        self.host = (HostTier(config.host_bytes, pinned=self.device.type == "cuda")
                     if config.host_bytes else None)
        self._lock = threading.Lock()
        self._index: dict[bytes, tuple[_Entry, int]] = {}
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._counts = dict.fromkeys(
            ("lookups", "device_hits", "host_hits", "partial_hits", "misses", "uncached",
             "evictions", "host_spills", "tokens_reused", "tokens_written"), 0)

    @classmethod
    def for_model(cls, model: torch.nn.Module, config: PromptCacheConfig) -> "PromptCache":
        """A cache for ``model``'s KV (its config, dtype and device)."""
        param = next(model.parameters())
        return cls(KVGeometry.of_model(model.config, param.dtype), config, param.device)

    @property
    def page_tokens(self) -> int:
        return self.config.page_tokens

    # ------------------------------------------------------------------ batch lifecycle
    def reserve(self, scope: CacheScope, rows: list[PromptRow]) -> Reservation:
        """Plan every row of a batch (see ``RowPlan``); must be ``finish``ed."""
        reservation = Reservation([], self.page_tokens)
        with self._lock:
            for row in rows:
                reservation.plans.append(self._plan(scope, row, reservation))
        return reservation

    def finish(self, reservation: Reservation, keep: bool) -> None:
        """Publish what the batch wrote (``keep``) or give it all back; unpin what it read.
        Idempotent."""
        with self._lock:
            if reservation.finished:
                return
            reservation.finished = True
            for action in (reservation._commits if keep else reservation._rollbacks):
                action()
            for entry in reservation._readers:
                entry.readers -= 1

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                **self._counts, entries=len(self._entries),
                device_bytes=self.pool.table.used * self.geometry.page_bytes(self.page_tokens),
                host_entries=len(self.host) if self.host else 0,
                host_bytes=self.host.used if self.host else 0)

    def clear(self) -> None:
        """Drop every unpinned entry (device and host tiers)."""
        with self._lock:
            for entry in list(self._entries.values()):
                if entry.readers == 0 and not entry.writer:
                    self._drop(entry, spill=False)
            if self.host:
                self.host.clear()

    # ------------------------------------------------------------------------ planning
    def _plan(self, scope: CacheScope, row: PromptRow, res: Reservation) -> RowPlan:
        frozen = row.frozen
        if frozen <= 0:
            return RowPlan(0, 0, (), "none")
        records = token_records(row.tokens[:frozen], row.segments[:frozen])
        # A returning user's frozen part is usually cached whole: one digest finds it, and
        # the digests of every boundary (thousands for a long history) are not needed.
        whole = self._index.get(prefix_digest(scope, records, frozen))
        if whole is not None and whole[1] == frozen:
            entry = whole[0]
            self._entries.move_to_end(id(entry))
            plan = self._read(entry, frozen, res, "device")
            self._count(plan, frozen)
            return plan
        bounds = safe_boundaries(row.segments, frozen)
        digests = prefix_digests(scope, records, bounds)
        found, tier = self._longest(digests), "device"
        if self.host is not None:
            # The host tier may hold a longer part than the device (say, a common intro).
            promoted = self._promote(digests, found)
            if promoted is not None:
                found, tier = promoted, "host"
            elif found is not None and id(found[0]) not in self._entries:
                found = None                  # evicted while making room for the promotion
        if found is None:
            plan = self._extend(None, 0, frozen, bounds, digests, res, "miss")
        else:
            entry, length = found
            self._entries.move_to_end(id(entry))
            plan = (self._read(entry, length, res, tier) if length == frozen
                    else self._extend(entry, length, frozen, bounds, digests, res, tier))
        self._count(plan, frozen)
        return plan

    def _count(self, plan: RowPlan, frozen: int) -> None:
        counts = self._counts
        counts["lookups"] += 1
        if plan.tier in ("device", "host"):
            counts[f"{plan.tier}_hits"] += 1
            counts["partial_hits"] += plan.cached < frozen
        else:
            counts["misses" if plan.tier == "miss" else "uncached"] += 1
        counts["tokens_reused"] += plan.cached

    def _longest(self, digests: list[bytes]) -> tuple[_Entry, int] | None:
        for digest in reversed(digests):
            found = self._index.get(digest)
            if found is not None:
                return found
        return None

    def _read(self, entry: _Entry, length: int, res: Reservation, tier: str) -> RowPlan:
        entry.readers += 1
        res._readers.append(entry)
        return RowPlan(length, length, tuple(entry.pages[:self._pages_for(length)]), tier)

    def _pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_tokens)

    def _extend(self, entry: _Entry | None, length: int, frozen: int, bounds: list[int],
                digests: list[bytes], res: Reservation, tier: str) -> RowPlan:
        """Plan writing tokens ``[length, frozen)``: into ``entry`` in place when it ends at
        ``length`` and nobody else writes it, else into a new entry sharing its whole
        pages."""
        need = self._pages_for(frozen)
        keep = [entry] if entry is not None else []
        if entry is not None and entry.length == length and not entry.writer:
            new = self._take(need - len(entry.pages), keep)
            if new is None:
                return self._read(entry, length, res, tier)
            entry.pages.extend(new)
            entry.writer = True
            entry.readers += 1
            res._readers.append(entry)

            def commit(entry=entry):
                entry.length, entry.writer = frozen, False
                self._register(entry, bounds, digests)
                self._counts["tokens_written"] += frozen - length

            def rollback(entry=entry, new=new):
                entry.writer = False
                del entry.pages[len(entry.pages) - len(new):]
                self.pool.table.release(new)

            res._commits.append(commit)
            res._rollbacks.append(rollback)
            return RowPlan(length, frozen, tuple(entry.pages[:need]), tier)
        whole = length // self.page_tokens if entry is not None else 0
        new = self._take(need - whole, keep)
        if new is None:
            if entry is not None:
                # No room beside the entry it continues: compute it whole, the entry may go.
                return self._extend(None, 0, frozen, bounds, digests, res, "miss")
            return RowPlan(0, 0, (), "uncached")
        shared = entry.pages[:whole] if entry is not None else []
        self.pool.table.share(shared)
        head = length - whole * self.page_tokens
        if head:
            self.pool.copy_head(entry.pages[whole], new[0], head)
        fresh = _Entry(shared + new, length)

        def commit(fresh=fresh):
            fresh.length = frozen
            self._register(fresh, bounds, digests)
            if fresh.registered:
                self._entries[id(fresh)] = fresh
                self._counts["tokens_written"] += frozen - length
            else:
                # Another request of the batch or a concurrent one kept the same part first.
                self.pool.table.release(fresh.pages)

        def rollback(fresh=fresh):
            self.pool.table.release(fresh.pages)

        res._commits.append(commit)
        res._rollbacks.append(rollback)
        return RowPlan(length, frozen, tuple(fresh.pages), tier)

    def _register(self, entry: _Entry, bounds: list[int], digests: list[bytes]) -> None:
        """Make every prefix of ``entry`` up to its length findable (first writer wins)."""
        for n, digest in zip(bounds, digests):
            if n <= entry.length and digest not in self._index:
                self._index[digest] = (entry, n)
                entry.registered.append(digest)

    def _promote(self, digests: list[bytes], on_device: tuple[_Entry, int] | None) -> tuple[_Entry, int] | None:
        """Move the host tier's longest match back into device pages when it is longer than
        the device's match ``on_device`` (kept meanwhile); None when it has none or the pool
        has no room."""
        found = self.host.longest(digests)
        if found is None or (on_device is not None and found[1] <= on_device[1]):
            return None
        record, length = found
        need = self._pages_for(length)
        pages = self._take(need, [on_device[0]] if on_device else [])
        if pages is None and on_device is not None:
            pages = self._take(need, [])      # the longer host part is worth the device's
        if pages is None:
            return None
        self.pool.load(pages, record.kv[:, :, :length])
        entry = _Entry(pages, length)
        self._entries[id(entry)] = entry
        self._register(entry, record.boundaries, record.digests)
        self.host.take(record)
        return entry, length

    # ------------------------------------------------------------------------ eviction
    def _take(self, count: int, keep: list[_Entry]) -> list[int] | None:
        """``count`` free pages, evicting least recently used entries that no request holds
        (and none in ``keep``); None when even that leaves too few."""
        table = self.pool.table
        if count <= 0:
            return []
        while table.free < count:
            victim = next((e for e in self._entries.values()
                           if e.readers == 0 and not e.writer and all(e is not k for k in keep)),
                          None)
            if victim is None:
                return None
            self._drop(victim, spill=True)
        return table.take(count)

    def _drop(self, entry: _Entry, spill: bool) -> None:
        if spill:
            self._counts["evictions"] += 1
        if spill and self.host is not None and entry.length:
            bounds = [self._index[d][1] for d in entry.registered]
            kv = self.pool.read(entry.pages[:self._pages_for(entry.length)], entry.length)
            if self.host.put(kv, bounds, list(entry.registered)):
                self._counts["host_spills"] += 1
        for digest in entry.registered:
            if self._index.get(digest, (None,))[0] is entry:
                del self._index[digest]
        entry.registered.clear()
        self._entries.pop(id(entry), None)
        self.pool.table.release(entry.pages)


def _indexed(device: torch.device) -> torch.device:
    """``cuda`` as ``cuda:N`` of the current device (what a model's parameters report), so a
    cache made with either name matches the engine that uses it."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
