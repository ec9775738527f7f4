"""``cap_paths`` where a crowd of near-identical items is bigger than a whole prefix can hold:
every item gets a path, no path or subtree over its share, the crowd spills to the nearest
codes with room, and two runs agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.catalog_build.items import planted
from xgr_catalog.collisions import cap_paths, path_keys
from xgr_catalog.kmeans import KMeansConfig, encode, fit_codebooks

LEVELS, SIZE, CAP = 2, 8, 12       # a first-level prefix holds at most 12 x 8 = 96 items
CROWD = 200


@pytest.fixture(scope="module")
def crowded():
    """400 planted items and 200 near-identical copies of one of them (600 <= 12 x 8 x 8):
    (points, codebooks, codes, item errors), the crowd on one first-level code."""
    points, _, _ = planted(count=400, seed=5)
    rng = np.random.default_rng(6)
    crowd = points[:1] + rng.normal(0.0, 1e-3, (CROWD, points.shape[1])).astype(np.float32)
    tensor = torch.from_numpy(np.concatenate([points, crowd]))
    codebooks = fit_codebooks(tensor, KMeansConfig(levels=LEVELS, codebook_size=SIZE,
                                                   iterations=8, progress=False))
    coded = encode(tensor, codebooks, 65_536, False)
    assert int(coded.codes[400:, 0].unique().numel()) == 1      # the premise: one crowded prefix
    return tensor, codebooks, coded.codes, coded.item_errors


def capped(crowded, **settings):
    points, codebooks, codes, errors = crowded
    return cap_paths(points, codebooks, codes, errors, CAP, progress=False, **settings)


def test_a_crowd_bigger_than_its_prefix_spills_to_the_nearest_first_level_codes(crowded):
    points, codebooks, codes, _ = crowded
    result = capped(crowded)
    assert result.codes.shape == codes.shape and bool((result.codes >= 0).all())
    assert bool((result.codes < SIZE).all())
    _, per_path = torch.unique(path_keys(result.codes, SIZE), return_counts=True)
    assert int(per_path.max()) <= CAP and int(per_path.sum()) == 600
    per_prefix = torch.bincount(result.codes[:, 0], minlength=SIZE)
    assert int(per_prefix.max()) <= CAP * SIZE
    assert result.moved_per_level[0] >= CROWD - CAP * SIZE
    assert result.moved_next_code == result.moved_per_level[-1]
    assert result.max_items_per_path_before >= CROWD and result.added_error > 0
    # A moved item took the nearest first-level code with room: every nearer one is full.
    moved = torch.nonzero(result.codes[:, 0] != codes[:, 0]).flatten()
    assert moved.numel() == result.moved_per_level[0]
    for item in moved.tolist():
        distances = ((points[item] - codebooks[0]) ** 2).sum(dim=1)
        chosen = int(result.codes[item, 0])
        for nearer in torch.nonzero(distances < distances[chosen]).flatten().tolist():
            assert int(per_prefix[nearer]) == CAP * SIZE, (item, nearer)


def test_a_candidate_batch_smaller_than_the_codes_needed_still_places_every_item(crowded):
    result = capped(crowded, candidates=2)
    _, per_path = torch.unique(path_keys(result.codes, SIZE), return_counts=True)
    assert int(per_path.max()) <= CAP and int(per_path.sum()) == 600
    assert int(torch.bincount(result.codes[:, 0], minlength=SIZE).max()) <= CAP * SIZE
    assert result.moved_per_level[0] >= CROWD - CAP * SIZE
    assert result.rounds > 2          # batches after the first were offered


@pytest.mark.parametrize("candidates", [64, 2])
def test_two_runs_give_the_same_codes(crowded, candidates):
    first, second = (capped(crowded, candidates=candidates, chunk=64) for _ in range(2))
    assert torch.equal(first.codes, second.codes)
    assert first.to_json() == second.to_json()


def test_to_json_counts_the_moves_per_level(crowded):
    saved = capped(crowded).to_json()
    assert len(saved["moved_per_level"]) == LEVELS
    assert saved["moved_next_code"] == saved["moved_per_level"][-1]
    assert set(saved) >= {"items_over_cap", "paths_over_cap", "max_items_per_path_before",
                          "added_error", "rounds"}


def test_three_levels_keep_every_subtree_within_its_share():
    """3 levels of 4 codes, cap 3: a first-level subtree holds at most 48 items, a second-level
    one 12; 60 near-identical items among 150 overflow both, and moved items' deeper codes are
    encoded again before the next level caps them."""
    points, _, _ = planted(count=90, seed=7)
    rng = np.random.default_rng(8)
    crowd = points[:1] + rng.normal(0.0, 1e-3, (60, points.shape[1])).astype(np.float32)
    tensor = torch.from_numpy(np.concatenate([points, crowd]))
    codebooks = fit_codebooks(tensor, KMeansConfig(levels=3, codebook_size=4, iterations=6,
                                                   progress=False))
    coded = encode(tensor, codebooks, 65_536, False)
    result = cap_paths(tensor, codebooks, coded.codes, coded.item_errors, 3, candidates=2,
                       chunk=16, progress=False)
    assert result.moved_per_level[0] >= 60 - 48 and len(result.moved_per_level) == 3
    for length, share in ((1, 48), (2, 12), (3, 3)):
        _, per_prefix = torch.unique(path_keys(result.codes, 4, length), return_counts=True)
        assert int(per_prefix.max()) <= share and int(per_prefix.sum()) == 150, length
