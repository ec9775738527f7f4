"""A request's excluded items as the fused selection needs them, one Triton launch each.

``beam_search.excluded_rows`` (item ids -> sorted, deduplicated rows of ``path_items``) and
``beam_search.exhausted_prefixes`` (per level, the prefixes all of whose items are excluded)
are the plain-torch definitions: about 18 and 3 x 16 small kernels a search. Inside a CUDA
graph each costs a few microseconds whatever its size, so these two kernels do the same work in
one launch each (one program per request):

* ``excluded_rows``: a binary search of each id among the catalog's sorted ids, a sort of the
  request's rows, and a compaction that drops repeats and unknown ids.
* ``exhausted_prefixes``: for every level at once, the prefix holding each excluded row. A
  prefix is exhausted when the sorted, distinct rows hold all of its rows ``lo .. hi - 1``:
  since they are strictly increasing integers, that is when the row ``row - lo`` places to
  the left is ``lo`` and the one ``hi - 1 - row`` places to the right is ``hi - 1``. Each of
  its rows then emits the prefix, as the torch definition does, so the outputs are equal.

Same results as the torch functions, bit for bit. Shapes alone decide each launch (values are
never read on the host), so both capture in CUDA graphs. The engine's eager and captured
searches call the launchers; traced programs call the same launches as ops registered with
``torch.library.triton_op`` (``xgr::excluded_rows``, ``xgr::exhausted_prefixes``: AOTInductor
compiles the kernels into its package), whose blocks cover the largest exclusion width the
program accepts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from torch_engine.catalog import Catalog
from xgr_common.errors import InvalidInputError, require
from torch_engine.kernels import _common as c
from torch_engine.kernels._sorted_search import search

# One program holds a request's exclusion row; EngineConfig.max_exclude defaults to 4096.
MAX_BLOCK = 16384


@dataclass(frozen=True)
class ExclusionTables:
    """The catalog tables the two kernels read, on the catalog's device: the sorted item ids
    and their rows, and the item ranges of the prefixes of each length 1..L as one flat
    ``indptr`` (length l's table starts at ``starts[l - 1]``; it has ``totals[l - 1] + 1``
    entries). Built once per catalog (``of``): the flat copy is not redone per search."""

    lookup_ids: torch.Tensor
    lookup_rows: torch.Tensor
    indptr: torch.Tensor
    starts: torch.Tensor
    totals: torch.Tensor
    num_items: int
    levels: int
    widest: int                     # most prefixes of one length

    @classmethod
    def of(cls, catalog: Catalog) -> "ExclusionTables":
        tables = [catalog.item_indptr(length) for length in range(1, catalog.levels + 1)]
        offsets = [0]
        for table in tables[:-1]:
            offsets.append(offsets[-1] + table.shape[0])
        device = catalog.device
        totals = catalog.num_prefixes[1:]
        return cls(lookup_ids=catalog.item_lookup_ids, lookup_rows=catalog.item_lookup_rows,
                   indptr=torch.cat(tables),
                   starts=torch.tensor(offsets, dtype=torch.int64, device=device),
                   totals=torch.tensor(totals, dtype=torch.int64, device=device),
                   num_items=catalog.num_items, levels=catalog.levels, widest=max(totals))


@triton.jit
def _excluded_rows_kernel(exclude_ptr, ids_ptr, rows_ptr, out_ptr, excluded, num_items,
                          BLOCK: tl.constexpr, STEPS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    inside = j < excluded
    ident = tl.load(exclude_ptr + b * excluded + j, mask=inside, other=-1)
    pos = search(ids_ptr, num_items, ident, STEPS, False)
    found = (ident >= 0) & (pos < num_items)
    found = found & (tl.load(ids_ptr + pos, mask=found, other=-1) == ident)
    # Unknown ids and padding lanes become the sentinel, which sorts after every row.
    row = tl.where(found, tl.load(rows_ptr + pos, mask=found, other=0), num_items)
    row = tl.sort(row)
    out = out_ptr + b * excluded
    # Registers cannot be indexed: the left neighbour comes back through the output row.
    tl.store(out + j, row, mask=inside)
    tl.debug_barrier()
    left = tl.load(out + j - 1, mask=inside & (j > 0), other=-1)
    keep = inside & (row < num_items) & (row != left)
    kept = tl.sum(keep.to(tl.int32), 0)
    slot = tl.cumsum(keep.to(tl.int32), 0) - 1
    tl.debug_barrier()
    tl.store(out + slot, row, mask=keep)
    tl.store(out + j, tl.zeros_like(row) + num_items, mask=inside & (j >= kept))


@triton.jit
def _exhausted_kernel(rows_ptr, indptr_ptr, starts_ptr, totals_ptr, out_ptr, excluded,
                      num_items, LEVELS: tl.constexpr, BLOCK: tl.constexpr,
                      STEPS: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    batch = tl.num_programs(0)
    j = tl.arange(0, BLOCK)
    inside = j < excluded
    rows = rows_ptr + b * excluded
    row = tl.load(rows + j, mask=inside, other=num_items)
    live = row < num_items                       # the distinct rows come first, sorted
    count = tl.sum(live.to(tl.int32), 0)
    for level in tl.static_range(LEVELS):
        indptr = indptr_ptr + tl.load(starts_ptr + level)
        total = tl.load(totals_ptr + level)
        prefix = search(indptr, total + 1, row, STEPS, True) - 1
        lo = tl.load(indptr + prefix, mask=live, other=0)
        hi = tl.load(indptr + prefix + 1, mask=live, other=0)
        first_at = j - (row - lo)
        last_at = j + (hi - 1 - row)
        whole = live & (first_at >= 0) & (last_at < count)
        first = tl.load(rows + first_at, mask=whole, other=-1)
        last = tl.load(rows + last_at, mask=whole, other=-1)
        whole = whole & (first == lo) & (last == hi - 1)
        done = tl.sum(whole.to(tl.int32), 0)
        slot = tl.cumsum(whole.to(tl.int32), 0) - 1
        out = out_ptr + (level * batch + b) * excluded
        tl.store(out + slot, prefix, mask=whole)
        tl.store(out + j, tl.zeros_like(prefix) + total, mask=inside & (j >= done))


def _checked_block(op: str, name: str, table: torch.Tensor, catalog_table: torch.Tensor
                   ) -> int:
    """Checks a ``[B, X]`` int64 request table (contiguous, B and X >= 1, on the catalog
    tables' device) and returns the block of one program: X up to a power of two (the largest
    X a traced program accepts)."""
    c.check_rank(op, name, table, 2, "[B, X]")
    c.check_index(op, name, table, allowed=(torch.int64,))
    batch, columns = table.shape
    require(batch >= 1 and columns >= 1, InvalidInputError,
            f"{op}: {name} must have B, X >= 1, got shape {tuple(table.shape)}")
    block = max(2, triton.next_power_of_2(c.bounded_size(op, f"{name}.shape[1]", columns)))
    require(block <= MAX_BLOCK, InvalidInputError,
            f"{op}: {name} may have at most {MAX_BLOCK} columns, got {columns}")
    c.check_devices(op, {name: table, "the catalog tables": catalog_table})
    return block


def _warps(block: int) -> int:
    return min(8, max(1, block // 256))


def excluded_rows(exclude_items: torch.Tensor, tables: ExclusionTables) -> torch.Tensor:
    """``beam_search.excluded_rows`` in one launch: ``exclude_items [B, X]`` int64, contiguous
    (X >= 1, -1 = padding, ids not in the catalog ignored) -> ``[B, X]`` int64 rows of
    ``path_items``, sorted, distinct, padded with the sentinel ``num_items``."""
    return _launch_excluded_rows(exclude_items, tables.lookup_ids, tables.lookup_rows,
                                 tables.num_items)


def exhausted_prefixes(rows: torch.Tensor, tables: ExclusionTables) -> torch.Tensor:
    """``beam_search.exhausted_prefixes`` of every level in one launch: ``rows [B, X]`` from
    ``excluded_rows`` -> ``[L, B, X]`` int64, entry ``level`` being that level's ``blocked``
    input of the fused selection (prefixes of ``level + 1`` codes, sorted, padded with the
    count of such prefixes)."""
    return _launch_exhausted(rows, tables.indptr, tables.starts, tables.totals,
                             tables.num_items, tables.levels, tables.widest)


def traced_excluded_rows(exclude_items: torch.Tensor, tables: ExclusionTables) -> torch.Tensor:
    """``excluded_rows`` as the op ``xgr::excluded_rows``, for traced programs."""
    return torch.ops.xgr.excluded_rows(exclude_items, tables.lookup_ids, tables.lookup_rows,
                                       tables.num_items)


def traced_exhausted_prefixes(rows: torch.Tensor, tables: ExclusionTables) -> torch.Tensor:
    """``exhausted_prefixes`` as the op ``xgr::exhausted_prefixes``, for traced programs."""
    return torch.ops.xgr.exhausted_prefixes(rows, tables.indptr, tables.starts, tables.totals,
                                            tables.num_items, tables.levels, tables.widest)


def _launch_excluded_rows(exclude_items, lookup_ids, lookup_rows, num_items: int):
    block = _checked_block("excluded_rows", "exclude_items", exclude_items, lookup_ids)
    batch, columns = exclude_items.shape
    out = torch.empty((batch, columns), dtype=torch.int64, device=exclude_items.device)
    with c.on_device(out.device):
        wrap_triton(_excluded_rows_kernel)[(batch,)](
            exclude_items, lookup_ids, lookup_rows, out, columns, num_items, BLOCK=block,
            STEPS=num_items.bit_length(), num_warps=_warps(block))
    return out


def _launch_exhausted(rows, indptr, starts, totals, num_items: int, levels: int, widest: int):
    block = _checked_block("exhausted_prefixes", "rows", rows, indptr)
    batch, columns = rows.shape
    out = torch.empty((levels, batch, columns), dtype=torch.int64, device=rows.device)
    with c.on_device(out.device):
        wrap_triton(_exhausted_kernel)[(batch,)](
            rows, indptr, starts, totals, out, columns, num_items, LEVELS=levels, BLOCK=block,
            STEPS=(widest + 1).bit_length(), num_warps=_warps(block))
    return out


@triton_op("xgr::excluded_rows", mutates_args=())
def _excluded_rows_op(exclude_items: torch.Tensor, lookup_ids: torch.Tensor,
                      lookup_rows: torch.Tensor, num_items: int) -> torch.Tensor:
    return _launch_excluded_rows(exclude_items, lookup_ids, lookup_rows, num_items)


@triton_op("xgr::exhausted_prefixes", mutates_args=())
def _exhausted_op(rows: torch.Tensor, indptr: torch.Tensor, starts: torch.Tensor,
                  totals: torch.Tensor, num_items: int, levels: int, widest: int
                  ) -> torch.Tensor:
    return _launch_exhausted(rows, indptr, starts, totals, num_items, levels, widest)
