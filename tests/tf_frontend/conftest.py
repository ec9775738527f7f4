"""A small synthetic world and feature graphs over it, shared by the tf_frontend tests."""

import numpy as np
import pytest

from xgr_common.layout import TokenLayout
from xgr_common.prompt_spec import PromptSpec
from xgr_world.synthetic import WorldConfig, make_world

# A short window and keep_last so that the window filter and the truncation both have work.
SPEC = PromptSpec(layout=TokenLayout(codebook_size=64, code_base=128), window_seconds=20 * 86400,
                  keep_last=6, embedding_buckets=97, embedding_dim=8, tower_hidden=16,
                  profile_tokens=2, model_hidden=12)


@pytest.fixture(scope="session")
def world():
    return make_world(WorldConfig(num_items=400, num_users=24, codebook_size=64,
                                  categories=6, subcategories=4, history_events=14, seed=3))


@pytest.fixture(scope="session")
def catalog_rows(world):
    """Every item but every ninth is in the catalog, so some history items are unknown."""
    return np.flatnonzero(np.arange(len(world.item_ids)) % 9 != 0)


@pytest.fixture(scope="session")
def weights():
    rng = np.random.default_rng(11)
    s = SPEC
    return {
        "embedding_table": rng.normal(size=(s.embedding_buckets, s.embedding_dim)),
        "tower_weights": {
            "profile_tower": [rng.normal(size=(2 * s.embedding_dim, s.tower_hidden)) * 0.3,
                              rng.normal(size=s.tower_hidden) * 0.1],
            "profile_projection": [rng.normal(size=(s.tower_hidden,
                                                    s.profile_tokens * s.model_hidden)) * 0.3,
                                   rng.normal(size=s.profile_tokens * s.model_hidden) * 0.1]},
    }


@pytest.fixture(scope="session")
def graph(world, catalog_rows, weights):
    from tf_frontend.feature_graph import FeatureGraph

    return FeatureGraph(SPEC, world.item_ids[catalog_rows], world.item_codes[catalog_rows],
                        embedding_table=weights["embedding_table"],
                        tower_weights=weights["tower_weights"])
