"""``torch.export`` keeps the exclusion width dynamic down to one column: the search
(``torch_engine.search``) exported with ``exclude_items`` of X in [1, 8] columns returns, at
X = 1 and 2, the items of the eager ``Engine.recommend``."""

import numpy as np
import pytest
import torch

from torch_engine import beam_search as bs
from torch_engine import search
from torch_engine.catalog import Catalog
from torch_engine.config import EngineConfig
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_common.tolerances import tolerance_for

# Heavy (torch.export of the search): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

FP32 = tolerance_for(torch.float32)
BEAMS, TOP_K = 8, 10


def catalog_of(seed: int, items: int = 80) -> tuple[np.ndarray, Catalog]:
    rng = np.random.default_rng(seed)
    ids = rng.choice(np.arange(5000), size=items, replace=False).astype(np.int64)
    return ids, Catalog.from_arrays(ids, rng.integers(0, 6, (items, 3)))


def exclusion_dims(max_width: int = 8) -> dict[int, torch.export.Dim]:
    return {0: torch.export.Dim("batch", min=1, max=16),
            1: torch.export.Dim("exclude", min=1, max=max_width)}


class ExcludedRows(torch.nn.Module):
    def __init__(self, catalog: Catalog):
        super().__init__()
        self.catalog = catalog

    def forward(self, exclude_items):
        return bs.excluded_rows(exclude_items, self.catalog)


@pytest.mark.parametrize("rows,width", [(3, 1), (2, 2), (1, 5)])
@pytest.mark.parametrize("example_width", [1, 2])
def test_excluded_rows_exports_for_one_and_two_columns(example_width, rows, width):
    ids, catalog = catalog_of(0)
    gen = torch.Generator().manual_seed(example_width * 10 + width)
    example = torch.full((2, example_width), -1, dtype=torch.int64)
    example[:, 0] = int(ids[0])
    # A one-column example is a size torch.export specialises on its own (0/1
    # specialisation) unless sizes are treated size-obliviously; two columns need nothing.
    oblivious = example_width == 1
    with torch.fx.experimental._config.patch(backed_size_oblivious=oblivious):
        program = torch.export.export(ExcludedRows(catalog), (example,),
                                      dynamic_shapes=(exclusion_dims(),))
    # Known ids (with repeats), unknown ids and padding.
    pool = torch.tensor(np.concatenate([ids[:4], [7, 9999, -1]]))
    items = pool[torch.randint(0, pool.shape[0], (rows, width), generator=gen)]
    assert torch.equal(program.module()(items), bs.excluded_rows(items, catalog))


class Search(torch.nn.Module):
    """``search.search`` on causal prompts with the exclusion table passed as given."""

    def __init__(self, engine: Engine):
        super().__init__()
        self.model, self.catalog, self.options = engine.model, engine.catalog, engine.options

    def forward(self, token_ids, lengths, exclude_items):
        batch = search.RequestBatch(
            token_ids=token_ids, total_lengths=lengths,
            segment_ids=torch.zeros_like(token_ids, dtype=torch.int32), causal=True,
            prefix_embeds=None, exclude_items=exclude_items)
        return search.search(self.model, self.catalog, batch, BEAMS, TOP_K, self.options)


@pytest.mark.parametrize("columns", [1, 2])
def test_engine_search_exports_with_one_and_two_exclusion_columns(columns):
    ids, catalog = catalog_of(1)
    engine = Engine(Model.from_preset("tiny", seed=5), catalog,
                    EngineConfig(static_shapes=True))
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(8, 1024, (2, 9), generator=gen)
    lengths = torch.tensor([9, 6])
    example = torch.tensor([[int(ids[0]), -1], [int(ids[1]), int(ids[2])]])
    exclude = example if columns == 2 else torch.tensor([[int(ids[3])], [-1]])
    with torch.no_grad():
        program = torch.export.export(Search(engine), (tokens, lengths, example),
                                      dynamic_shapes=(None, None, {1: exclusion_dims()[1]}))
        # The items the search returns without exclusions, so the exclusions matter.
        best = engine.recommend(tokens, lengths, beam_width=BEAMS, top_k=TOP_K)[0]
        exclude = torch.where(exclude >= 0, best[:, :exclude.shape[1]], -1)
        want = engine.recommend(tokens, lengths, beam_width=BEAMS, top_k=TOP_K,
                                exclude_items=exclude)
        got = program.module()(tokens, lengths, exclude)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], atol=FP32.atol, rtol=FP32.rtol)
    assert not bool(torch.isin(got[0], exclude[exclude >= 0]).any())
