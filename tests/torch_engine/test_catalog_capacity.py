"""Catalogs padded to capacities: one set of table shapes serves every catalog within them, and
a padded catalog searches exactly like its unpadded self."""

import pytest
import torch

from tests.torch_engine.engine_worlds import prompts, small_world
from torch_engine.catalog import PAD_ID, Catalog, CatalogSize
from torch_engine.config import EngineConfig
from torch_engine.engine import Engine
from torch_engine.model import Model
from xgr_common.errors import CatalogError

CAPACITY = CatalogSize(items=90, prefixes=(8, 40, 80), fanout=(8, 8, 6), items_per_path=5)


@pytest.fixture(scope="module")
def model():
    return Model.from_preset("tiny", seed=11)


def shapes(catalog):
    return {name: tuple(t.shape) for name, t in catalog.tensors().items()}


def test_padding_keeps_the_real_sizes_and_unpads_to_the_same_tables():
    ids, codes = small_world()
    catalog = Catalog.from_arrays(ids, codes)
    padded = catalog.padded(CAPACITY)
    assert padded.table_size == CAPACITY and padded.size == catalog.size
    assert padded.reachable_items(4) == catalog.reachable_items(4)
    assert padded.path_items.shape == (90,) and padded.item_lookup_ids[-1] == PAD_ID
    back = padded.unpadded()
    for name, tensor in catalog.tensors().items():
        assert torch.equal(back.tensors()[name], tensor), name
    # Padding twice pads from the real tables.
    assert shapes(padded.padded(CAPACITY)) == shapes(padded)


def test_catalogs_within_one_capacity_share_their_table_shapes():
    one = Catalog.from_arrays(*small_world(seed=0, n=60)).padded(CAPACITY)
    other = Catalog.from_arrays(*small_world(seed=5, n=40, used_codes=4)).padded(CAPACITY)
    assert shapes(one) == shapes(other)
    assert one.size != other.size


def test_a_catalog_over_its_capacity_is_refused_naming_each_size():
    catalog = Catalog.from_arrays(*small_world(n=60))
    small = CatalogSize(items=50, prefixes=(8, 40, 80), fanout=(8, 3, 6), items_per_path=5)
    with pytest.raises(CatalogError, match=r"items 60 > 50.*fanout of level 1 \d+ > 3"):
        catalog.padded(small)
    with pytest.raises(CatalogError, match="names 2 levels"):
        catalog.padded(CatalogSize(items=90, prefixes=(8, 40), fanout=(8, 8),
                                   items_per_path=5))


def test_headroom_grows_every_size_within_the_codebook():
    size = CatalogSize(items=100, prefixes=(200, 300, 400), fanout=(200, 10, 3),
                       items_per_path=4)
    grown = CatalogSize.with_headroom(size, 1.5, codebook_size=256)
    assert grown == CatalogSize(items=150, prefixes=(256, 450, 600), fanout=(256, 15, 5),
                                items_per_path=6)
    assert CatalogSize.from_json(grown.to_json()) == grown
    with pytest.raises(CatalogError, match="headroom"):
        CatalogSize.with_headroom(size, 0.5, 256)
    with pytest.raises(CatalogError, match="positive ints"):
        CatalogSize(items=0, prefixes=(1,), fanout=(1,), items_per_path=1)


@pytest.mark.parametrize("selection", ["torch", "triton"])
@pytest.mark.parametrize("width,top_k", [(1, 1), (4, 6), (8, 12), (16, 30)])
def test_a_padded_catalog_searches_like_the_unpadded_one(model, selection, width, top_k):
    """Widths 8 and 16 keep every level-0 prefix on both (the capacity, 8 prefixes, fits);
    width 4 ranks on both. Exclusions include an unknown id and the padding id."""
    ids, codes = small_world()
    catalog = Catalog.from_arrays(ids, codes)
    config = EngineConfig(selection_backend=selection)
    plain = Engine(model, catalog, config)
    padded = Engine(model, catalog.padded(CAPACITY), config)
    tokens, lengths, segs = prompts(7, [12, 9, 15])
    exclude = [torch.tensor([int(ids[0]), 999_999]), torch.tensor([PAD_ID]),
               torch.tensor(ids[5:20])]
    for given in (None, exclude):
        want = plain.recommend(tokens, lengths, segs, beam_width=width, top_k=top_k,
                               exclude_items=given)
        got = padded.recommend(tokens, lengths, segs, beam_width=width, top_k=top_k,
                               exclude_items=given)
        assert torch.equal(got[0], want[0])
        assert torch.equal(got[1], want[1])


def test_top_k_is_bounded_by_the_real_catalog_not_the_capacity(model):
    catalog = Catalog.from_arrays(*small_world())
    engine = Engine(model, catalog.padded(CAPACITY))
    tokens, lengths, segs = prompts(1, [10])
    reachable = catalog.reachable_items(1)
    with pytest.raises(Exception, match=str(reachable)):
        engine.recommend(tokens, lengths, segs, beam_width=1, top_k=reachable + 1)
