"""``build_catalog``: planted clusters come back as codes, every item keeps a reachable path
with no path over its cap, the file passes the catalog file's checks, and the report says
what happened (with faiss beside ours where faiss-cpu is installed)."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest
import torch

from tests.catalog_build.items import SUBS, TOPS, planted, write_npy, write_parquet
from torch_engine.catalog import Catalog
from xgr_catalog import CatalogBuildConfig, build_catalog
from xgr_catalog.collisions import cap_paths
from xgr_catalog.kmeans import KMeansConfig, encode, fit_codebooks
from xgr_checkpoint.catalog_file import read_catalog
from xgr_common.errors import CatalogError, ConfigError
from xgr_common.layout import TokenLayout

SMALL = dict(levels=2, codebook_size=8, iterations=10, progress=False)


def one_to_one(labels: np.ndarray, codes: np.ndarray) -> bool:
    """Each planted label maps to exactly one code and each code to one label."""
    pairs = {(int(label), int(code)) for label, code in zip(labels, codes)}
    return (len(pairs) == len(set(labels.tolist())) == len({code for _, code in pairs}))


def test_planted_clusters_come_back_as_the_codes_of_both_levels(tmp_path):
    points, top, sub = planted()
    ids = np.arange(points.shape[0], dtype=np.int64) * 7 + 3
    source, id_path = write_npy(tmp_path, points, ids)
    # ~50 items a planted (coarse, fine) pair: a cap of 100 keeps every pair on one path.
    report = build_catalog(CatalogBuildConfig(
        embeddings=str(source), ids=str(id_path), out=str(tmp_path / "catalog.parquet"),
        max_items_per_path=100, **SMALL))
    catalog = read_catalog(tmp_path / "catalog.parquet", levels=2, codebook_size=8)
    np.testing.assert_array_equal(catalog.item_ids, ids)
    assert one_to_one(top, catalog.item_codes[:, 0])
    assert one_to_one(sub, catalog.item_codes[:, 1])
    assert catalog.num_paths == TOPS * SUBS and report.paths["paths"] == TOPS * SUBS
    assert report.collisions["items_over_cap"] == 0
    # The error falls by level, to the planted noise (0.3 a dimension -> 16 * 0.09).
    assert report.errors[0] > report.errors[1]
    assert report.errors[1] < 2 * 16 * 0.3 ** 2 < 0.01 * report.variance
    assert all(use["used"] == 8 for use in report.code_use)


def test_a_crowded_catalog_keeps_every_item_reachable_and_no_path_over_its_cap(tmp_path):
    """600 copies of one vector beside 400 planted items: the copies' path overflows, its
    prefix too (8 codes x cap 20 = 160), so items move to other first-level codes and then to
    next-nearest last codes; the catalog the engine builds from the file has every item on a
    path of at most the cap, and top_k stays reachable at the beam."""
    points, top, _ = planted(count=400)
    crowd = np.repeat(points[:1], 600, axis=0)
    embeddings = np.concatenate([points, crowd])
    source, _ = write_npy(tmp_path, embeddings)
    cap, beam, top_k = 20, 8, 40
    report = build_catalog(CatalogBuildConfig(
        embeddings=str(source), out=str(tmp_path / "catalog.npz"), max_items_per_path=cap,
        beam_width=beam, top_k=top_k, **SMALL))
    moved = report.collisions
    assert moved["max_items_per_path_before"] >= 601
    first, last = moved["moved_per_level"]
    assert first >= 600 - 160 and last == moved["moved_next_code"] > 0
    file = read_catalog(tmp_path / "catalog.npz", levels=2, codebook_size=8)
    assert sorted(file.item_ids.tolist()) == list(range(embeddings.shape[0]))
    _, per_path = np.unique(file.item_codes, axis=0, return_counts=True)
    assert per_path.max() <= cap and report.paths["max_items_per_path"] == per_path.max()
    engine = Catalog.from_arrays(file.item_ids, file.item_codes,
                                 TokenLayout(levels=2, codebook_size=8))
    assert engine.max_items_per_path <= cap <= top_k      # an item is never past top_k
    assert engine.reachable_items(beam) >= top_k == report.reachability["top_k"]
    assert sorted(engine.path_items.tolist()) == list(range(embeddings.shape[0]))
    # The planted items off the crowded prefix keep their coarse cluster.
    assert one_to_one(top[top != top[0]], file.item_codes[:400][top != top[0], 0])
    assert report.error_after_cap >= report.errors[-1]


def test_overflow_items_take_their_next_nearest_code_nearest_first():
    """One path of 12 items with cap 4: the 4 best-fitting stay, the rest go to their
    next-nearest last-level code while it has room, the nearest arrivals first."""
    rng = np.random.default_rng(3)
    points = torch.from_numpy(rng.normal(0, 1, (12, 2)).astype(np.float32))
    codebooks = torch.tensor([[[0.0, 0.0], [9.0, 9.0], [20.0, 20.0], [30.0, -30.0]],
                              [[0.0, 0.0], [0.5, 0.0], [-2.0, 0.0], [0.0, 3.0]]])
    codes = torch.zeros((12, 2), dtype=torch.int64)
    errors = (points * points).sum(dim=1)
    result = cap_paths(points, codebooks, codes, errors, cap=4, progress=False)
    kept = torch.argsort(errors)[:4]
    assert (result.codes[kept] == 0).all()                      # the nearest four stay
    assert result.items_over_cap == 8 and result.moved_per_level == (0, 8)
    _, per_path = torch.unique(result.codes, dim=0, return_counts=True)
    assert per_path.max() <= 4
    assert (result.codes[:, 0] == 0).all()                       # same prefix
    for item in set(range(12)) - set(kept.tolist()):
        distances = ((points[item] - codebooks[1]) ** 2).sum(dim=1)
        distances[0] = float("inf")
        order = torch.argsort(distances).tolist()
        # its code is one of its next-nearest, and any nearer one is full
        chosen = int(result.codes[item, 1])
        for nearer in order[:order.index(chosen)]:
            assert int((result.codes[:, 1] == nearer).sum()) == 4
    moved = [item for item in range(12) if int(result.codes[item, 1]) != 0]
    added = sum(float(((points[item] - codebooks[1][result.codes[item, 1]]) ** 2).sum()
                      - errors[item]) for item in moved)
    assert result.added_error == pytest.approx(added / 12, rel=1e-5)


def test_same_seed_same_catalog_and_train_sample_encodes_every_row(tmp_path):
    points, _, _ = planted(count=1500, seed=2)
    source, _ = write_npy(tmp_path, points)
    configs = [CatalogBuildConfig(embeddings=str(source), out=str(tmp_path / f"{name}.npz"),
                                  train_sample=600, report=False, max_items_per_path=50,
                                  **SMALL)
               for name in ("first", "second")]
    reports = [build_catalog(config) for config in configs]
    first, second = (read_catalog(config.out, 2, 8) for config in configs)
    np.testing.assert_array_equal(first.item_codes, second.item_codes)
    assert first.num_items == 1500 and reports[0].train_rows == 600
    assert reports[0].report_json is None and not (tmp_path / "first.report.json").exists()


def test_the_report_is_written_beside_the_catalog_with_its_plot(tmp_path):
    points, _, _ = planted(count=800)
    ids = np.arange(800, dtype=np.int64) + 10
    source = write_parquet(tmp_path / "items.parquet", ids, points, title=[f"t{i}" for i in ids])
    report = build_catalog(CatalogBuildConfig(embeddings=str(source),
                                              out=str(tmp_path / "built.parquet"),
                                              max_items_per_path=30, **SMALL))
    saved = json.loads((tmp_path / "built.report.json").read_text())
    assert saved["items"] == 800 and saved["paths"]["paths"] == report.paths["paths"]
    assert len(saved["code_use"]) == 2 and sum(saved["code_use"][0]["counts"]) == 800
    assert sum(int(size) * paths for size, paths in saved["paths"]["histogram"].items()) == 800
    assert set(saved["timings"]) >= {"read", "fit", "encode", "cap", "write"}
    png = (tmp_path / "built.report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    text = report.summary()
    for piece in ("800 items (Parquet column 'embedding', 16 dims)", "codes used per level",
                  "distinct paths", "reconstruction error", "collisions (cap 30)",
                  "reachability", "built.report.png"):
        assert piece in text, text


@pytest.mark.skipif(importlib.util.find_spec("faiss") is None, reason="faiss-cpu not installed")
def test_faiss_sits_beside_ours_on_the_same_rows(tmp_path):
    points, _, _ = planted(count=2000)
    source, _ = write_npy(tmp_path, points)
    report = build_catalog(CatalogBuildConfig(embeddings=str(source),
                                              out=str(tmp_path / "c.npz"), faiss=True,
                                              train_sample=1000, max_items_per_path=100,
                                              **SMALL))
    faiss = report.faiss
    assert faiss["settings"]["train_rows"] == 1000 and faiss["settings"]["max_beam_size"] == 1
    assert len(faiss["errors"]) == 2 and faiss["train_s"] >= 0
    # Same algorithm, same rows: the errors are of one size (planted, both find the clusters).
    assert report.errors[-1] <= 1.5 * faiss["errors"][-1]
    assert "faiss" in report.timings and "faiss" in report.summary()


def test_without_faiss_the_comparison_names_the_flag(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)
    points, _, _ = planted(count=400)
    source, _ = write_npy(tmp_path, points)
    with pytest.raises(ConfigError, match=r"--faiss .*faiss-cpu"):
        build_catalog(CatalogBuildConfig(embeddings=str(source), out=str(tmp_path / "c.npz"),
                                         faiss=True, max_items_per_path=100, **SMALL))


@pytest.mark.parametrize("changes, match", [
    (dict(max_items_per_path=301), "above --top_k 300"),
    (dict(max_items_per_path=1), r"x --beam_width 256 = 256 < --top_k 300"),
    (dict(out="catalog.csv"), r"--out 'catalog.csv'"),
    (dict(codebook_size=0), "--codebook_size must be a positive int"),
    (dict(train_sample=4), "below --codebook_size"),
    (dict(text_column="title"), "--text_column goes with --text_model"),
], ids=["cap over top_k", "beam cannot reach top_k", "out suffix", "codebook", "sample",
        "text column alone"])
def test_settings_that_cannot_work_are_refused_naming_the_flag(changes, match):
    with pytest.raises(ConfigError, match=match):
        CatalogBuildConfig(**{"embeddings": "items.npy", "out": "catalog.npz", **changes})


def test_a_catalog_whose_beam_cannot_reach_top_k_is_refused_before_writing(tmp_path):
    """8 distinct items, 8 codes, one level: each item gets a path of its own, so beam 4
    reaches 4 items, fewer than top_k 8; nothing is written."""
    points, _, _ = planted(count=8)
    source, _ = write_npy(tmp_path, points)
    with pytest.raises(CatalogError, match=r"beam 4 reaches 4 items < --top_k 8"):
        build_catalog(CatalogBuildConfig(embeddings=str(source), out=str(tmp_path / "c.npz"),
                                         levels=1, codebook_size=8, iterations=5,
                                         max_items_per_path=2, beam_width=4, top_k=8,
                                         progress=False))
    assert not (tmp_path / "c.npz").exists()


def test_too_few_items_for_top_k_or_too_many_for_the_paths(tmp_path):
    points, _, _ = planted(count=100)
    source, _ = write_npy(tmp_path, points)
    with pytest.raises(ConfigError, match="100 items, fewer than --top_k 300"):
        build_catalog(CatalogBuildConfig(embeddings=str(source), out=str(tmp_path / "c.npz"),
                                         **SMALL))
    with pytest.raises(ConfigError, match=r"100 items cannot fit 2 \*\* 2 paths of at most 4"):
        build_catalog(CatalogBuildConfig(embeddings=str(source), out=str(tmp_path / "c.npz"),
                                         levels=2, codebook_size=2, max_items_per_path=4,
                                         beam_width=8, top_k=10, progress=False))


def test_chunked_passes_give_the_chunk_free_codes():
    points, _, _ = planted(count=700, seed=4)
    tensor = torch.from_numpy(points)
    whole = fit_codebooks(tensor, KMeansConfig(levels=2, codebook_size=8, iterations=6,
                                               progress=False, chunk=100_000))
    chunked = fit_codebooks(tensor, KMeansConfig(levels=2, codebook_size=8, iterations=6,
                                                 progress=False, chunk=256))
    torch.testing.assert_close(whole, chunked, rtol=1e-4, atol=1e-4)
    assert torch.equal(encode(tensor, whole, 100_000, False).codes,
                       encode(tensor, chunked, 256, False).codes)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_build_is_repeatable_and_keeps_the_rules(tmp_path, device):
    # 3,000 items over 8 x 8 paths of at most 60: the cap binds on the fuller paths.
    points, top, _ = planted(count=3000)
    source, _ = write_npy(tmp_path, points)
    report = build_catalog(CatalogBuildConfig(embeddings=str(source), device=device,
                                              out=str(tmp_path / "c.npz"), max_items_per_path=60,
                                              **SMALL))
    catalog = read_catalog(tmp_path / "c.npz", 2, 8)
    assert report.device.startswith(device) and one_to_one(top, catalog.item_codes[:, 0])
    assert catalog.max_items_per_path <= 60
    again = build_catalog(CatalogBuildConfig(embeddings=str(source), device=device,
                                             out=str(tmp_path / "d.npz"), max_items_per_path=60,
                                             **SMALL))
    np.testing.assert_array_equal(read_catalog(tmp_path / "d.npz", 2, 8).item_codes,
                                  catalog.item_codes)
    assert again.errors == report.errors
