"""Catalog constraint tables against a plain-Python construction from the item list."""

import numpy as np
import pytest
import torch

from torch_engine.catalog import Catalog
from xgr_common.errors import CatalogError
from xgr_common.layout import TokenLayout

LAYOUT = TokenLayout(levels=3, codebook_size=8)


def _random_catalog(seed: int, n: int = 300):
    rng = np.random.default_rng(seed)
    ids = rng.choice(np.arange(10 * n), size=n, replace=False).astype(np.int64)
    codes = rng.integers(0, 5, (n, 3)).astype(np.int32)  # collisions: several items per path
    return ids, codes


@pytest.mark.parametrize("seed", [0, 1])
def test_tables_match_python_construction(seed):
    ids, codes = _random_catalog(seed)
    cat = Catalog.from_arrays(ids, codes, LAYOUT)
    prefixes = [sorted({tuple(c[:length]) for c in codes.tolist()}) for length in range(4)]
    assert cat.num_prefixes == tuple(len(p) for p in prefixes)
    for level in range(3):
        parents_seen = []
        for pid, prefix in enumerate(prefixes[level]):
            lo, hi = cat.level_indptr[level][pid].item(), cat.level_indptr[level][pid + 1].item()
            children = [p for p in prefixes[level + 1] if p[:level] == prefix]
            # CSR entry e is prefix e of the next length: its code and parent match.
            assert [prefixes[level + 1][e] for e in range(lo, hi)] == children
            assert cat.level_codes[level][lo:hi].tolist() == [c[level] for c in children]
            parents_seen += [pid] * (hi - lo)
        assert cat.level_parents[level].tolist() == parents_seen
    for pid, path in enumerate(prefixes[3]):
        lo, hi = cat.path_indptr[pid].item(), cat.path_indptr[pid + 1].item()
        expected = sorted(ids[(codes == path).all(axis=1)].tolist())
        assert cat.path_items[lo:hi].tolist() == expected
    assert cat.max_items_per_path == max(
        int(((codes == p).all(axis=1)).sum()) for p in prefixes[3])
    rows = cat.item_lookup_rows[torch.searchsorted(cat.item_lookup_ids, torch.from_numpy(ids))]
    assert torch.equal(cat.path_items[rows], torch.from_numpy(ids))
    for length in range(1, 4):                     # items under each prefix: one row range
        indptr = cat.item_indptr(length)
        assert indptr.shape == (cat.num_prefixes[length] + 1,)
        for pid, prefix in enumerate(prefixes[length]):
            lo, hi = indptr[pid].item(), indptr[pid + 1].item()
            under = (codes[:, :length] == prefix).all(axis=1)
            assert sorted(cat.path_items[lo:hi].tolist()) == sorted(ids[under].tolist())
    with pytest.raises(CatalogError, match="prefix length"):
        cat.item_indptr(0)


def test_catalog_moves_between_devices_and_accepts_tensors():
    ids, codes = _random_catalog(2, 50)
    cat = Catalog.from_arrays(torch.from_numpy(ids), torch.from_numpy(codes), LAYOUT)
    moved = cat.to("cpu")
    assert moved.device.type == "cpu" and moved.num_prefixes == cat.num_prefixes
    assert all(torch.equal(a, b) for a, b in zip(moved.level_codes, cat.level_codes))
    assert cat.nbytes() > 0


@pytest.mark.parametrize("ids,codes,match", [
    ([1, 2, 2], [[0, 0, 0], [0, 0, 1], [1, 0, 0]], "unique"),
    ([1, 2], [[0, 0, 8], [0, 0, 1]], r"codes must lie in \[0, codebook_size=8\)"),
    ([1, 2], [[0, 0], [0, 1]], r"codes must have shape \[N=2, levels=3\]"),
    ([-5, 2], [[0, 0, 0], [0, 0, 1]], "item_ids must be >= 0"),
    ([], np.zeros((0, 3), dtype=np.int32), "non-empty"),
    ([1.5, 2.0], [[0, 0, 0], [0, 0, 1]], "item_ids must be integers"),
])
def test_bad_catalog_raises_catalog_error(ids, codes, match):
    with pytest.raises(CatalogError, match=match):
        Catalog.from_arrays(np.asarray(ids), np.asarray(codes), LAYOUT)
