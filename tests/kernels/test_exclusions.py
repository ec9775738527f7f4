"""The exclusion kernels (``torch_engine.kernels.exclusions``) against their torch definitions
``beam_search.excluded_rows`` and ``beam_search.exhausted_prefixes``: equal outputs, exactly.

On the CPU the kernels run under Triton's interpreter (the root conftest sets it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.sm90_compile import assert_no_spills, compiled_lines
from torch_engine import beam_search as bs
from torch_engine.catalog import Catalog
from xgr_common.errors import InvalidInputError
from torch_engine.kernels.exclusions import (ExclusionTables, excluded_rows,
                                             exhausted_prefixes)
from xgr_common.layout import TokenLayout



def small_catalog(rng: np.random.Generator, items: int, size: int) -> Catalog:
    """Few codes, so that many prefixes hold only a handful of items (easy to exhaust)."""
    codes = rng.integers(0, size, (items, 3))
    ids = rng.choice(items * 5, size=items, replace=False)
    return Catalog.from_arrays(ids, codes, TokenLayout(codebook_size=size))


def exclusions(gen: torch.Generator, catalog: Catalog, batch: int, columns: int,
               whole_prefix: bool) -> torch.Tensor:
    """``[B, X]`` ids: catalog items (repeats included), ids not in the catalog, -1 padding;
    with ``whole_prefix`` the first rows also exclude every item of one full path, so some
    prefixes of each length are exhausted."""
    ids = catalog.item_lookup_ids
    out = ids[torch.randint(0, ids.shape[0], (batch, columns), generator=gen)]
    roll = torch.rand((batch, columns), generator=gen)
    out = torch.where(roll < 0.15, torch.full_like(out, -1), out)
    out = torch.where((roll >= 0.15) & (roll < 0.25), out * 5 + 10**9, out)   # unknown ids
    if whole_prefix:
        for b in range(batch):
            path = int(torch.randint(0, catalog.num_prefixes[-1], (1,), generator=gen))
            lo, hi = int(catalog.path_indptr[path]), int(catalog.path_indptr[path + 1])
            items = catalog.path_items[lo:hi][: columns // 2]
            out[b, : items.shape[0]] = items
    return out


@pytest.mark.parametrize("batch,columns,items,size", [
    (1, 1, 50, 4), (3, 2, 50, 4), (2, 7, 200, 3), (4, 64, 300, 4), (2, 256, 2000, 8)])
@pytest.mark.parametrize("whole_prefix", [False, True])
def test_kernels_equal_the_torch_definitions(batch, columns, items, size, whole_prefix):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (1,), generator=gen)))
    catalog = small_catalog(rng, items, size)
    tables = ExclusionTables.of(catalog)
    exclude = exclusions(gen, catalog, batch, columns, whole_prefix)
    want_rows = bs.excluded_rows(exclude, catalog)
    got_rows = excluded_rows(exclude, tables)
    assert torch.equal(got_rows, want_rows), f"{got_rows}\n{want_rows}"
    got = exhausted_prefixes(got_rows, tables)
    assert got.shape == (catalog.levels, batch, columns)
    for level in range(catalog.levels):
        want = bs.exhausted_prefixes(want_rows, catalog, level)
        assert torch.equal(got[level], want), f"level {level}\n{got[level]}\n{want}"


def test_a_fully_excluded_path_blocks_its_prefixes():
    """Every item of one prefix of length 1 excluded: that prefix and all its descendants
    are exhausted at their levels; the output names each once per excluded row."""
    codes = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [1, 1, 1]])
    catalog = Catalog.from_arrays(np.arange(5) + 100, codes, TokenLayout(codebook_size=2))
    tables = ExclusionTables.of(catalog)
    rows = excluded_rows(torch.tensor([[102, 101, 100, -1, 7, 100]]), tables)
    assert rows.tolist() == [[0, 1, 2, 5, 5, 5]]
    blocked = exhausted_prefixes(rows, tables)
    # Length 1: prefix (0) holds rows 0-2, all excluded. Length 2: (0,0) rows 0-1, (0,1)
    # row 2. Length 3: the paths (0,0,0), (0,0,1), (0,1,0).
    assert blocked[0].tolist() == [[0, 0, 0, 2, 2, 2]]
    assert blocked[1].tolist() == [[0, 0, 1, 4, 4, 4]]
    assert blocked[2].tolist() == [[0, 1, 2, 5, 5, 5]]


@pytest.mark.parametrize("case,match", [
    ("float", "exclude_items.dtype"), ("rank", r"exclude_items must have shape \[B, X\]"),
    ("empty", "B, X >= 1"), ("wide", "at most 16384 columns"),
    ("strided", "exclude_items must be contiguous")])
def test_bad_exclusions_name_the_argument(case, match):
    catalog = small_catalog(np.random.default_rng(0), 20, 4)
    tables = ExclusionTables.of(catalog)
    bad = {"float": torch.zeros((1, 2)), "rank": torch.zeros(3, dtype=torch.int64),
           "empty": torch.zeros((1, 0), dtype=torch.int64),
           "wide": torch.zeros((1, 16385), dtype=torch.int64),
           "strided": torch.zeros((2, 4), dtype=torch.int64)[:, ::2]}[case]
    with pytest.raises(InvalidInputError, match=match):
        excluded_rows(bad, tables)


# Both kernels compiled for sm_90 without a GPU (``tests.sm90_compile``).
_COMPILE = """
from torch_engine.kernels.exclusions import _excluded_rows_kernel, _exhausted_kernel, _warps
for block in (2, 1024, 4096):
    # excluded == 1 comes as a constant: Triton's rule for int arguments equal to 1.
    one = block == 2
    columns = dict(excluded="constexpr" if one else "i32", num_items="i32")
    constants = dict(excluded=1) if one else {}
    for name, fn, pointers, extra in (
            ("rows", _excluded_rows_kernel, ("exclude", "ids", "rows", "out"), dict(STEPS=24)),
            ("prefixes", _exhausted_kernel, ("rows", "indptr", "starts", "totals", "out"),
             dict(LEVELS=3, STEPS=22))):
        signature = {**{f"{p}_ptr": "*i64" for p in pointers}, **columns,
                     **{key: "constexpr" for key in (*extra, "BLOCK")}}
        kernel = triton.compile(ASTSource(fn=fn, signature=signature,
                                          constexprs=dict(constants, BLOCK=block, **extra)),
                                target=TARGET, options=dict(num_warps=_warps(block)))
        print("COMPILED", name, block, usage(kernel))
"""


@pytest.mark.heavy
def test_kernels_compile_for_sm90():
    assert_no_spills(compiled_lines(_COMPILE, 6))


@pytest.mark.gpu
@pytest.mark.parametrize("columns", [1, 512, 4096])
def test_gpu_kernels_equal_the_torch_definitions(columns):
    gen = torch.Generator().manual_seed(columns)
    rng = np.random.default_rng(columns)
    catalog = small_catalog(rng, 200_000, 64)
    exclude = exclusions(gen, catalog, 8, columns, True).cuda()
    catalog = catalog.to("cuda")
    tables = ExclusionTables.of(catalog)
    rows = excluded_rows(exclude, tables)
    want_rows = bs.excluded_rows(exclude, catalog)
    assert torch.equal(rows, want_rows)
    got = exhausted_prefixes(rows, tables)
    for level in range(catalog.levels):
        assert torch.equal(got[level], bs.exhausted_prefixes(want_rows, catalog, level))
