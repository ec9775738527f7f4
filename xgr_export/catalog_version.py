"""A new catalog for a served model without a new engine package: the catalog-only version.

An export with a catalog capacity (``ExportConfig.catalog_headroom``) compiles a package that
reads the catalog's tables as inputs padded to the capacity; TorchCall loads them once from
the version's tables file (``engine_package.write_tables``). Such an export records how its
engine was built (``ENGINE_RECORD_FILE``). A later export with ``ExportConfig.engine_from``
naming that SavedModel reuses its package: it reads the record, takes the engine's settings
from it, checks the new catalog against the rules below, writes only the new tables and the
TF half (feature graph with the new semantic-ID table, rules), and hard-links the package file
into the new version, so a server holding both versions loads the package once (TorchCall
knows a package by its file, not its path).

Rules for the new catalog:
- every size within the package's capacity (``CatalogError`` names each size over it);
- an item in both catalogs keeps its codes (a model learned the old ones; changed codes would
  silently recommend other items);
- each served beam width still reaches ``top_k`` items.
Items added are served at once. Items retired are no longer recommended, and a history that
holds them drops them when the prompt is built: the new version's semantic-ID table misses
them, and the feature graph drops history events it cannot look up.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from torch_engine.catalog import CatalogSize
from xgr_common.errors import CatalogError, ExportError, require
from xgr_export.config import EngineExportConfig
from xgr_export.engine_package import read_tables_source
from xgr_export.torch_package import Package

# Relative to a version folder: how its engine package was built (JSON).
ENGINE_RECORD_FILE = "assets.extra/xgr_engine.json"

__all__ = ["ENGINE_RECORD_FILE", "EngineRecord", "link_package", "require_codes_kept"]


@dataclass(frozen=True)
class EngineRecord:
    """How a SavedModel's engine package was built: its contract (``package``, whose path is
    the asset inside ``saved_model``), its tables file, the search it serves and the settings
    an export of the same package must use."""

    saved_model: Path
    package: Package
    tables: Path
    capacity: CatalogSize
    engine: EngineExportConfig
    dtype: str
    attention_backend: str
    layer_kernels: str
    prefill_mask: str

    def write(self) -> Path:
        """``ENGINE_RECORD_FILE`` of ``saved_model`` (file names relative to its assets)."""
        package = {**self.package.to_json(), "path": self.package.path.name}
        data = {"package": package, "tables": self.tables.name,
                "capacity": self.capacity.to_json(),
                "engine": {**asdict(self.engine), "beam_widths": list(self.engine.beam_widths)},
                "dtype": self.dtype, "attention_backend": self.attention_backend,
                "layer_kernels": self.layer_kernels, "prefill_mask": self.prefill_mask}
        path = self.saved_model / ENGINE_RECORD_FILE
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path

    @classmethod
    def read(cls, saved_model: str | os.PathLike) -> "EngineRecord":
        """The record of ``saved_model``; ``ExportError`` when it has none (exported without
        a catalog capacity: its catalog is compiled into the package) or its files are
        missing."""
        saved_model = Path(saved_model)
        path = saved_model / ENGINE_RECORD_FILE
        require(path.is_file(), ExportError,
                f"{saved_model} has no {ENGINE_RECORD_FILE}: only an export with a catalog "
                f"capacity (--catalog_headroom) serves a new catalog without a new package")
        try:
            data = json.loads(path.read_text())
            assets = saved_model / "assets"
            package = Package.from_json({**data["package"],
                                         "path": str(assets / data["package"]["path"])})
            engine = dict(data["engine"])
            engine["beam_widths"] = tuple(engine["beam_widths"])
            record = cls(saved_model=saved_model, package=package,
                         tables=assets / data["tables"],
                         capacity=CatalogSize.from_json(data["capacity"]),
                         engine=EngineExportConfig(**engine), dtype=data["dtype"],
                         attention_backend=data["attention_backend"],
                         layer_kernels=data["layer_kernels"],
                         prefill_mask=data["prefill_mask"])
        except (KeyError, TypeError, ValueError) as error:
            raise ExportError(f"{path} is malformed ({error}); export the engine again") from None
        for file in (record.package.path, record.tables):
            require(file.is_file(), ExportError,
                    f"{saved_model}: {file.name} is missing from its assets (copy the SavedModel "
                    f"whole)")
        return record

    def source_catalog(self) -> tuple[np.ndarray, np.ndarray]:
        """(item ids, codes) of the catalog this version serves."""
        _, ids, codes = read_tables_source(self.tables)
        return ids, codes


def require_codes_kept(old_ids: np.ndarray, old_codes: np.ndarray, new_ids: np.ndarray,
                       new_codes: np.ndarray) -> None:
    """``CatalogError`` naming items (a few, and how many) present in both catalogs whose
    codes differ."""
    common, old_at, new_at = np.intersect1d(old_ids, new_ids, assume_unique=True,
                                            return_indices=True)
    changed = np.flatnonzero((old_codes[old_at] != new_codes[new_at]).any(axis=1))
    if changed.size:
        examples = ", ".join(f"{int(common[i])}: {old_codes[old_at[i]].tolist()} -> "
                             f"{new_codes[new_at[i]].tolist()}" for i in changed[:3])
        raise CatalogError(
            f"{changed.size} items of the served catalog change their codes in the new one "
            f"(e.g. {examples}); codes of existing items never change: give a re-coded item a "
            f"new id, or train and export a new model")


def link_package(copied: Path, source: Path) -> bool:
    """Replaces ``copied`` (the package asset TF copied into the new version) with a hard link
    to ``source``, so one loaded package serves both versions; False (the copy stays) where
    the two are on different file systems."""
    if copied.stat().st_dev != source.stat().st_dev:
        return False
    staged = copied.with_name(copied.name + ".link")
    os.link(source, staged)
    os.replace(staged, copied)
    return True
