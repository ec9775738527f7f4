"""Torch twin of the semantic-ID table and ``XgrSemanticIdLookup``.

The table keeps ids sorted with their codes beside them and finds items with
``torch.searchsorted``: no Python loop over items, works on any device.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
import torch

from custom_ops.catalog_file import CatalogArrays, read_catalog, validate_catalog
from custom_ops.torch_twins import _checks
from xgr_common.errors import CatalogError, require


class CodeTokens(NamedTuple):
    code_tokens: torch.Tensor    # int64 [E', levels]
    row_splits: torch.Tensor     # int64 [B+1]
    unknown_count: torch.Tensor  # int64 [B]


class TorchSemanticIdTable:
    """Item id -> code path, validated like the TF table (unique ids, codes in range).

    ``sorted_ids`` int64 [N] ascending; ``codes`` int64 [N, levels], row i for sorted_ids[i].
    Raises ``CatalogError`` on duplicate ids or codes outside ``[0, codebook_size)``.
    """

    def __init__(self, item_ids, codes, codebook_size: int,
                 device: torch.device | str = "cpu"):
        cat = validate_catalog(np.asarray(item_ids), np.asarray(codes), codebook_size)
        self._init_from(cat, torch.device(device))

    @classmethod
    def from_file(cls, path: str | os.PathLike,
                  device: torch.device | str = "cpu") -> "TorchSemanticIdTable":
        """The table of a catalog file (``custom_ops.catalog_file``), the TF table's asset."""
        table = cls.__new__(cls)
        table._init_from(read_catalog(path), torch.device(device))
        return table

    @classmethod
    def from_sorted(cls, sorted_ids: torch.Tensor, codes: torch.Tensor,
                    codebook_size: int) -> "TorchSemanticIdTable":
        """A table on tensors already sorted by id (the ONNX node's catalog inputs), checked
        on their device: ids strictly increasing, codes int64 [N, levels] in range."""
        ids = _checks.int64_tensor(sorted_ids, "catalog_item_ids", 1)
        cds = _checks.int64_tensor(codes, "catalog_codes", 2)
        _checks.int_attr(codebook_size, 1, _checks.INT32_MAX, "codebook_size")
        require(cds.shape[0] == ids.numel() and cds.shape[1] >= 1, CatalogError,
                f"catalog_codes must have shape [{ids.numel()}, levels>=1], got {tuple(cds.shape)}")
        require(bool((ids[1:] > ids[:-1]).all()), CatalogError,
                "catalog_item_ids must be strictly increasing (sorted, unique)")
        require(cds.numel() == 0 or (int(cds.min()) >= 0 and int(cds.max()) < codebook_size),
                CatalogError, f"catalog_codes must lie in [0, codebook_size={codebook_size})")
        table = cls.__new__(cls)
        table._sorted_ids, table._codes, table._codebook_size = ids, cds, codebook_size
        return table

    def _init_from(self, cat: CatalogArrays, device: torch.device) -> None:
        # CatalogArrays come sorted by id.
        self._sorted_ids = torch.from_numpy(cat.item_ids).to(device)
        self._codes = torch.from_numpy(cat.codes.astype(np.int64)).to(device)
        self._codebook_size = cat.codebook_size

    @property
    def sorted_ids(self) -> torch.Tensor:
        return self._sorted_ids

    @property
    def codes(self) -> torch.Tensor:
        return self._codes

    @property
    def levels(self) -> int:
        return int(self._codes.shape[1])

    @property
    def codebook_size(self) -> int:
        return self._codebook_size

    def __len__(self) -> int:
        return int(self._sorted_ids.numel())

    def find(self, items: torch.Tensor) -> torch.Tensor:
        """Row of each item in ``sorted_ids``: int64 [E], -1 for items not in the catalog."""
        if len(self) == 0:
            return torch.full_like(items, -1)
        pos = torch.searchsorted(self._sorted_ids, items).clamp(max=len(self) - 1)
        return torch.where(self._sorted_ids[pos] == items, pos, torch.full_like(pos, -1))


def semantic_id_lookup(table: TorchSemanticIdTable, items: torch.Tensor,
                       row_splits: torch.Tensor, *, code_base: int) -> CodeTokens:
    """items int64 [E], row_splits int64 [B+1] -> ``CodeTokens(code_tokens int64 [E', levels],
    row_splits int64 [B+1], unknown_count int64 [B])``; token ``code_base + l*C + c_l``."""
    levels, size = table.levels, table.codebook_size
    _checks.int_attr(code_base, 0, _checks.INT64_MAX - levels * size, "code_base")
    items = _checks.int64_tensor(items, "items", 1)
    splits = _checks.row_splits(row_splits, items.numel(), "row_splits", "items")
    batch = splits.numel() - 1
    rows = _checks.row_ids(splits)
    found_at = table.find(items.to(table.sorted_ids.device))
    known = found_at >= 0
    offsets = code_base + torch.arange(levels, device=found_at.device) * size
    tokens = table.codes[found_at[known]] + offsets
    rows = rows.to(found_at.device)
    out_splits = torch.zeros(batch + 1, dtype=torch.int64, device=found_at.device)
    out_splits[1:] = torch.cumsum(torch.bincount(rows[known], minlength=batch), 0)
    unknown = torch.bincount(rows[~known], minlength=batch)
    return CodeTokens(tokens, out_splits, unknown)


def semantic_id_lookup_onnx(catalog_item_ids: torch.Tensor, catalog_codes: torch.Tensor,
                            items: torch.Tensor, row_splits: torch.Tensor, *, code_base: int,
                            codebook_size: int, levels: int) -> CodeTokens:
    """The ONNX node's form of the lookup: the catalog arrives as two inputs (ids sorted
    ascending int64 [N], codes int64 [N, levels]) instead of a table resource."""
    table = TorchSemanticIdTable.from_sorted(catalog_item_ids, catalog_codes, codebook_size)
    require(table.levels == levels, CatalogError,
            f"attribute levels={levels} does not match catalog_codes' {table.levels} levels")
    return semantic_id_lookup(table, items, row_splits, code_base=code_base)
