"""Residual k-means: recovers planted clusters, residual error falls by level, feeds a Catalog."""

import numpy as np
import pytest

from torch_engine.catalog import Catalog
from xgr_common.errors import ConfigError, InvalidInputError
from xgr_world.kmeans import KMeansConfig, residual_kmeans
from xgr_common.layout import TokenLayout


def planted(seed=0, clusters=6, per_cluster=80, dim=8):
    """Well-separated clusters, each with a finer spread around its centre."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 10.0, (clusters, dim))
    labels = np.repeat(np.arange(clusters), per_cluster)
    points = centres[labels] + rng.normal(0, 1.0, (labels.shape[0], dim))
    return points.astype(np.float32), labels


def test_level_zero_recovers_planted_clusters_and_error_falls():
    points, labels = planted()
    config = KMeansConfig(levels=3, codebook_size=6, iterations=8, chunk=100)
    result = residual_kmeans(points, config)
    assert result.codes.shape == (points.shape[0], 3) and result.codes.dtype == np.int32
    assert result.codes.min() >= 0 and result.codes.max() < 6
    # Each planted cluster maps to exactly one level-0 code and vice versa.
    pairs = {(int(t), int(c)) for t, c in zip(labels, result.codes[:, 0])}
    assert len(pairs) == 6 and len({c for _, c in pairs}) == 6
    assert result.errors[0] > result.errors[1] > result.errors[2]
    recon = result.reconstruct()
    assert np.allclose(((points - recon) ** 2).sum(axis=1).mean(), result.errors[-1], rtol=1e-4)
    baseline = ((points - points.mean(axis=0)) ** 2).sum(axis=1).mean()
    assert result.errors[-1] < 0.2 * baseline


def test_same_seed_same_codes_and_codes_build_a_catalog():
    points, _ = planted(seed=1)
    config = KMeansConfig(levels=2, codebook_size=8, iterations=5)
    first, second = residual_kmeans(points, config), residual_kmeans(points, config)
    assert np.array_equal(first.codes, second.codes)
    ids = np.arange(points.shape[0], dtype=np.int64) + 100
    catalog = Catalog.from_arrays(ids, first.codes, TokenLayout(levels=2, codebook_size=8))
    assert catalog.num_items == points.shape[0]


@pytest.mark.parametrize("embeddings,match", [
    (np.zeros((4,), dtype=np.float32), r"\[N, d\]"),
    (np.zeros((4, 2), dtype=np.int64), "floating point"),
    (np.array([[0.0, np.nan]], dtype=np.float32), "finite"),
])
def test_bad_embeddings_raise(embeddings, match):
    with pytest.raises(InvalidInputError, match=match):
        residual_kmeans(embeddings, KMeansConfig(levels=1, codebook_size=2, iterations=1))


def test_bad_config_raises():
    with pytest.raises(ConfigError, match="codebook_size"):
        KMeansConfig(codebook_size=0)
