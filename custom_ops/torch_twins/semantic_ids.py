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

    def _init_from(self, cat: CatalogArrays, device: torch.device) -> None:
        order = np.argsort(cat.item_ids, kind="stable")
        self._sorted_ids = torch.from_numpy(cat.item_ids[order]).to(device)
        self._codes = torch.from_numpy(cat.codes[order].astype(np.int64)).to(device)
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
