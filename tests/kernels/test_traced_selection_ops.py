"""The fused selection's kernels as the ops a traced program holds (``xgr::excluded_rows``,
``xgr::exhausted_prefixes``, ``xgr::expand_items``, ``xgr::constrained_topk``): registered with
``torch.library.triton_op``, so AOTInductor compiles them into an engine package, and equal to
the launchers the engine's own searches call. Blocks that must hold a whole row of a dynamic
width take the largest width the traced program accepts (``size_bound``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.kernels.test_exclusions import exclusions, small_catalog
from torch_engine import beam_search as bs
from torch_engine.kernels import _common as c
from torch_engine.kernels import exclusions as ex
from torch_engine.kernels import item_expansion as ie
from xgr_common.errors import InvalidInputError
from xgr_export.export import FUSED_SELECTION_OPS, resolve_selection
from xgr_export.torch_package import is_triton_op


def test_the_fused_selection_ops_are_embeddable():
    assert [name for name in FUSED_SELECTION_OPS if not is_triton_op(name)] == []
    assert resolve_selection("cuda:0") == "triton"
    assert resolve_selection("cpu") == "torch"


@pytest.mark.parametrize("batch,columns", [(1, 1), (3, 5), (2, 64)])
def test_the_traced_ops_equal_the_launchers(batch, columns):
    gen = torch.Generator().manual_seed(batch * 1000 + columns)
    catalog = small_catalog(np.random.default_rng(columns), 300, 4)
    tables = ex.ExclusionTables.of(catalog)
    exclude = exclusions(gen, catalog, batch, columns, whole_prefix=True)
    rows = ex.traced_excluded_rows(exclude, tables)
    assert torch.equal(rows, ex.excluded_rows(exclude, tables))
    assert torch.equal(ex.traced_exhausted_prefixes(rows, tables),
                       ex.exhausted_prefixes(rows, tables))
    width = 16
    scores = torch.randn((batch, width), generator=gen)
    paths = torch.randint(0, catalog.num_prefixes[-1], (batch, width), generator=gen)
    want = bs.expand_items(scores, paths, rows, catalog, 10)
    for got in (ie.traced_expand_items(scores, paths, rows, catalog.path_indptr,
                                       catalog.path_items, 10),
                ie.expand_items(scores, paths, rows, catalog.path_indptr, catalog.path_items,
                                10)):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_size_bound_is_the_traced_range_end():
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append((c.size_bound(x.shape[0]), c.size_bound(x.shape[1])))
            try:
                c.bounded_size("op", "x.shape[1]", x.shape[1])
            except InvalidInputError as err:
                seen.append(str(err))
            return x * 2

    torch.export.export(Probe(), (torch.zeros(2, 3),), strict=False,
                        dynamic_shapes=({0: torch.export.Dim("rows", min=1, max=37),
                                         1: torch.export.Dim.DYNAMIC},))
    (rows, width), refusal = seen[-2:]
    assert rows == 37 and width is None
    assert "op: x.shape[1] must have a bounded size in a traced program" in refusal
    assert c.size_bound(5) == 5
