"""``build_catalog(CatalogBuildConfig) -> CatalogBuildReport``: item embeddings -> catalog file.

read the items (``embeddings``) -> fit residual k-means codebooks and encode every item
(``kmeans``, on ``device``) -> cap the items a path holds (``collisions``) -> check that the
beam width reaches top_k -> write the catalog file (``xgr_checkpoint.catalog_file``) -> the
quality report (``report``), with faiss's residual quantiser beside ours when asked
(``faiss_baseline``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from xgr_catalog.collisions import cap_paths
from xgr_catalog.embeddings import read_embeddings
from xgr_catalog.kmeans import (KMeansConfig, encode, fit_codebooks, placed, resolve_device,
                                training_rows)
from xgr_catalog import report as reports
from xgr_catalog.report import CatalogBuildReport
from xgr_checkpoint.catalog_file import SUFFIXES as CATALOG_SUFFIXES, write_catalog
from xgr_common.errors import CatalogError, ConfigError, require


@dataclass(frozen=True)
class CatalogBuildConfig:
    """What ``xgr catalog build`` does; each field is the flag of its name.

    Source: ``embeddings`` (``.parquet`` or ``.npy``), with ``ids`` (an ``.npy`` of item ids
    beside an ``.npy`` of vectors), ``id_column`` and ``embedding_column`` (Parquet), or
    ``text_model`` (a sentence-transformers model folder) encoding ``text_column``; ``dim``:
    the width every row must have (None: whatever the file holds).
    Codes: ``levels`` x ``codebook_size``, ``iterations`` of Lloyd per level, fitted on
    ``train_sample`` rows (None: all) drawn with ``seed``, on ``device`` (``cpu``, ``cuda``,
    ``cuda:N``), ``chunk`` rows a pass.
    Collisions: at most ``max_items_per_path`` items a path, the others moved level by level
    to the nearest code with room, offered ``candidates`` codes a batch (bounds the memory);
    the catalog must let ``beam_width`` reach ``top_k`` items, and ``max_items_per_path <=
    top_k`` keeps every item reachable.
    Output: ``out`` (``.parquet`` or ``.npz``), and unless ``report`` is off the report beside
    it (``<out stem>.report.json`` and ``.report.png``). ``faiss``: also fit faiss's residual
    quantiser on the same rows (``faiss_beam``: its encoding beam).
    """

    embeddings: str
    out: str
    ids: str | None = None
    id_column: str = "item_id"
    embedding_column: str = "embedding"
    text_column: str | None = None
    text_model: str | None = None
    text_batch_size: int = 256
    dim: int | None = None
    levels: int = 3
    codebook_size: int = 256
    iterations: int = 20
    train_sample: int | None = None
    seed: int = 0
    device: str = "cpu"
    chunk: int = 65_536
    max_items_per_path: int = 16
    candidates: int = 64
    beam_width: int = 256
    top_k: int = 300
    report: bool = True
    faiss: bool = False
    faiss_beam: int = 1
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("embeddings", "out"):
            value = getattr(self, name)
            require(isinstance(value, (str, os.PathLike)) and os.fspath(value) != "",
                    ConfigError, f"--{name} must name a file, got {value!r}")
            object.__setattr__(self, name, os.fspath(value))
        require(Path(self.out).suffix.lower() in CATALOG_SUFFIXES, ConfigError,
                f"--out {self.out!r}: a catalog file ends in {' or '.join(CATALOG_SUFFIXES)}")
        for name in ("text_batch_size", "levels", "codebook_size", "iterations", "chunk",
                     "max_items_per_path", "candidates", "beam_width", "top_k", "faiss_beam"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                    ConfigError, f"--{name} must be a positive int, got {value!r}")
        for name in ("dim", "train_sample"):
            value = getattr(self, name)
            require(value is None or (isinstance(value, int) and value >= 1), ConfigError,
                    f"--{name} must be a positive int when given, got {value!r}")
        require(float(self.codebook_size) ** self.levels < 2.0 ** 62, ConfigError,
                f"--codebook_size ** --levels = {self.codebook_size} ** {self.levels} must stay "
                f"below 2**62 (the engine's catalog tables key a path by one int64)")
        require(self.train_sample is None or self.train_sample >= self.codebook_size,
                ConfigError, f"--train_sample {self.train_sample} is below --codebook_size "
                f"{self.codebook_size}: k-means needs at least one row a centroid")
        require(self.max_items_per_path <= self.top_k, ConfigError,
                f"--max_items_per_path {self.max_items_per_path} is above --top_k "
                f"{self.top_k}: the engine returns a reached path's items in id order, so an "
                f"item past the top_k-th of its path could never be returned")
        require(self.max_items_per_path * self.beam_width >= self.top_k, ConfigError,
                f"--max_items_per_path {self.max_items_per_path} x --beam_width "
                f"{self.beam_width} = {self.max_items_per_path * self.beam_width} < --top_k "
                f"{self.top_k}: that beam could never reach top_k items; the cap must be at "
                f"least {-(-self.top_k // self.beam_width)}")
        require(self.text_model is not None or self.text_column is None, ConfigError,
                "--text_column goes with --text_model (the model that encodes it)")


def build_catalog(config: CatalogBuildConfig) -> CatalogBuildReport:
    """Builds the catalog file ``config.out`` from ``config.embeddings`` and returns its
    report (also written beside it unless ``config.report`` is off).

    Raises ``EmbeddingFileError`` for a bad source file (naming the row or column),
    ``ConfigError`` for settings the data cannot meet, ``CatalogError`` when the built catalog
    would not let ``beam_width`` reach ``top_k`` items (nothing is written then).
    """
    device = resolve_device(config.device)
    if config.faiss:   # before any work: a missing faiss is known now, not after the fit
        from xgr_catalog.faiss_baseline import faiss_module

        faiss_module()
    timings: dict[str, float] = {}
    clock = _Clock(device, timings)
    items = read_embeddings(config.embeddings, ids_path=config.ids, id_column=config.id_column,
                            embedding_column=config.embedding_column,
                            text_column=config.text_column, text_model=config.text_model,
                            dim=config.dim, device=str(device),
                            text_batch_size=config.text_batch_size, progress=config.progress)
    clock.lap("read")
    count = items.num_items
    require(count >= config.top_k, ConfigError,
            f"{config.embeddings}: {count} items, fewer than --top_k {config.top_k}: the engine "
            f"could not return top_k items of this catalog; lower --top_k")
    capacity = config.max_items_per_path * config.codebook_size ** config.levels
    require(count <= capacity, ConfigError,
            f"{count} items cannot fit {config.codebook_size} ** {config.levels} paths of at "
            f"most {config.max_items_per_path} items (--max_items_per_path); raise it, "
            f"--codebook_size or --levels")
    points = placed(torch.from_numpy(items.embeddings), device)   # on the GPU once, if it fits
    kmeans = KMeansConfig(levels=config.levels, codebook_size=config.codebook_size,
                          iterations=config.iterations, chunk=config.chunk, seed=config.seed,
                          train_sample=config.train_sample, progress=config.progress)
    codebooks = fit_codebooks(points, kmeans, device)
    clock.lap("fit")
    coded = encode(points, codebooks, config.chunk, config.progress)
    clock.lap("encode")
    capped = cap_paths(points, codebooks, coded.codes, coded.item_errors,
                       config.max_items_per_path, config.candidates, config.chunk,
                       config.progress)
    clock.lap("cap")
    codes = capped.codes.to(codebooks.device)
    paths = reports.path_stats(codes, config.codebook_size)
    reachable = min(count, config.beam_width * paths["max_items_per_path"])
    require(reachable >= config.top_k, CatalogError,
            f"the built catalog has at most {paths['max_items_per_path']} items on a path, so "
            f"beam {config.beam_width} reaches {reachable} items < --top_k {config.top_k} "
            f"(the engine would refuse that top_k); nothing written. Use fewer --levels or a "
            f"smaller --codebook_size (more items share a path), or serve a wider beam")
    use = reports.code_use(codes, config.codebook_size)
    variance = _variance(points, codebooks.device, config.chunk)
    clock.lap("stats")
    written = write_catalog(config.out, items.item_ids, codes.to(torch.int32).cpu().numpy())
    clock.lap("write")
    faiss = None
    if config.faiss:
        from xgr_catalog.faiss_baseline import faiss_residual_quantizer

        rows = training_rows(count, kmeans)
        faiss, _ = faiss_residual_quantizer(
            items.embeddings, None if rows is None else rows.numpy(), config.levels,
            config.codebook_size, config.iterations, config.seed, config.faiss_beam,
            config.chunk, config.progress)
        faiss = faiss.to_json()
        clock.lap("faiss")
    stem = Path(written).with_suffix("")
    report = CatalogBuildReport(
        catalog=os.fspath(written), report_json=None, plot=None, plot_note=None, items=count,
        dim=items.dim, source=items.source, levels=config.levels,
        codebook_size=config.codebook_size, device=str(device), seed=config.seed,
        iterations=config.iterations, train_rows=min(count, config.train_sample or count),
        variance=variance, errors=coded.errors,
        error_after_cap=coded.errors[-1] + capped.added_error, code_use=use, paths=paths,
        collisions={"cap": config.max_items_per_path, "candidates": config.candidates,
                    **capped.to_json()},
        reachability={"beam_width": config.beam_width, "top_k": config.top_k,
                      "reachable_items": reachable,
                      "max_items_per_path": paths["max_items_per_path"]},
        timings=timings, faiss=faiss)
    if config.report:
        plot_path, note = reports.plot(report, f"{stem}.report.png")
        clock.lap("report")
        report = replace(report, plot=plot_path, plot_note=note,
                         report_json=f"{stem}.report.json")
        reports.write_json(report, report.report_json)
    return report


def _variance(points: torch.Tensor, device: torch.device, chunk: int) -> float:
    """Mean squared distance of the rows from their mean, in float64."""
    total = torch.zeros(points.shape[1], dtype=torch.float64, device=device)
    squares = torch.zeros((), dtype=torch.float64, device=device)
    for start in range(0, points.shape[0], chunk):
        block = points[start:start + chunk].to(device).double()
        total += block.sum(dim=0)
        squares += (block * block).sum()
    mean = total / points.shape[0]
    return float(squares / points.shape[0] - (mean * mean).sum())


class _Clock:
    """Seconds per stage into ``timings`` (waiting for the device first), each logged at INFO
    as it ends so that a long run shows where it is."""

    def __init__(self, device: torch.device, timings: dict[str, float]):
        self.device, self.timings = device, timings
        self.start = time.perf_counter()

    def lap(self, name: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.timings[name] = now - self.start
        self.start = now
        logging.getLogger(__name__).info("catalog build: %s %.1f s", name, self.timings[name])
