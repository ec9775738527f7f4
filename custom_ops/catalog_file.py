"""The semantic-ID catalog file: the on-disk form of an item id -> code path table.

Read by the C++ op ``XgrSemanticIdTableInitFromFile`` (stored as a SavedModel asset, so a
10M-item catalog is never a graph constant) and by the Torch-side table. NumPy only.

Layout, little-endian, no padding::

    offset 0    8 bytes   magic b"XGRSID01"
    offset 8    int64     N, the number of items
    offset 16   int64     levels
    offset 24   int64     codebook_size
    offset 32   int64[N]  item ids (any order, unique)
    then        int32[N, levels] codes, row-major, each in [0, codebook_size)

A 10M-item, 3-level catalog is 32 + 10M * 20 bytes = 200 MB.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from xgr_common.errors import CatalogError, require

MAGIC = b"XGRSID01"
HEADER_BYTES = 32
MAX_LEVELS = 2**20  # the ops' bound on the ``levels`` attribute


@dataclass(frozen=True)
class CatalogArrays:
    """A validated catalog in memory, sorted by id: ``item_ids`` int64 [N] strictly
    increasing, ``codes`` int32 [N, levels] (row i is item_ids[i]'s code path)."""

    item_ids: np.ndarray
    codes: np.ndarray
    codebook_size: int

    @property
    def levels(self) -> int:
        return int(self.codes.shape[1])


def validate_catalog(item_ids: np.ndarray, codes: np.ndarray, codebook_size: int) -> CatalogArrays:
    """Checks shapes, unique ids and code ranges (the rules the C++ table enforces at init).

    item_ids: integer [N]; codes: integer [N, levels] with levels >= 1. Returns the catalog
    sorted by id (int64 ids, int32 codes).
    """
    ids = np.asarray(item_ids)
    cds = np.asarray(codes)
    require(ids.ndim == 1 and np.issubdtype(ids.dtype, np.integer), CatalogError,
            f"item_ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
    require(cds.ndim == 2 and cds.shape[0] == ids.shape[0] and cds.shape[1] >= 1
            and np.issubdtype(cds.dtype, np.integer), CatalogError,
            f"codes must be an integer array of shape [{ids.shape[0]}, levels>=1], "
            f"got shape {cds.shape} dtype {cds.dtype}")
    require(1 <= codebook_size <= np.iinfo(np.int32).max, CatalogError,
            f"codebook_size must lie in [1, 2^31 - 1], got {codebook_size}")
    if cds.size:
        lo, hi = int(cds.min()), int(cds.max())
        require(lo >= 0 and hi < codebook_size, CatalogError,
                f"codes must lie in [0, codebook_size={codebook_size}), got values in [{lo}, {hi}]")
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order].astype(np.int64)
    dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
    require(dup.size == 0, CatalogError,
            f"item_ids must be unique, item {sorted_ids[dup[0]] if dup.size else ''} appears twice")
    return CatalogArrays(sorted_ids, cds[order].astype(np.int32), int(codebook_size))


def write_catalog(path: str | os.PathLike, item_ids: np.ndarray, codes: np.ndarray,
                  codebook_size: int) -> CatalogArrays:
    """Validates and writes a catalog file; returns the arrays written."""
    cat = validate_catalog(item_ids, codes, codebook_size)
    header = np.array([len(cat.item_ids), cat.levels, cat.codebook_size], dtype="<i8")
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(header.tobytes())
        f.write(cat.item_ids.astype("<i8").tobytes())
        f.write(np.ascontiguousarray(cat.codes, dtype="<i4").tobytes())
    return cat


@dataclass(frozen=True)
class CatalogHeader:
    num_items: int
    levels: int
    codebook_size: int


def read_header(path: str | os.PathLike) -> CatalogHeader:
    """The 32-byte header of a catalog file (magic checked, sizes not yet)."""
    size = os.path.getsize(path)
    require(size >= HEADER_BYTES, CatalogError,
            f"catalog file {path} has {size} bytes, fewer than its {HEADER_BYTES}-byte header")
    with open(path, "rb") as f:
        magic = f.read(8)
        fields = (int(v) for v in np.frombuffer(f.read(24), dtype="<i8"))
    require(magic == MAGIC, CatalogError, f"catalog file {path} does not start with {MAGIC!r}")
    return CatalogHeader(*fields)


def read_catalog(path: str | os.PathLike) -> CatalogArrays:
    """Reads and validates a catalog file (memory-mapped, then copied once)."""
    size = os.path.getsize(path)
    header = read_header(path)
    n, levels, codebook_size = header.num_items, header.levels, header.codebook_size
    require(1 <= levels <= MAX_LEVELS, CatalogError,
            f"catalog file {path} announces levels={levels}, outside [1, {MAX_LEVELS}]")
    require(n >= 0 and size == HEADER_BYTES + n * (8 + 4 * levels),
            CatalogError, f"catalog file {path} has {size} bytes; its header announces {n} "
            f"items of {levels} levels, which needs 32 + N * (8 + 4 * levels) bytes")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    ids = data[HEADER_BYTES:HEADER_BYTES + 8 * n].view("<i8")
    codes = data[HEADER_BYTES + 8 * n:].view("<i4").reshape(n, levels)
    return validate_catalog(np.array(ids), np.array(codes), codebook_size)
