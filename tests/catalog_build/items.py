"""Item embeddings with planted structure, written as the files ``xgr catalog build`` reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

TOPS, SUBS = 8, 8        # planted: 8 coarse clusters, each split the same 8 ways


def planted(count: int = 3200, dim: int = 16, seed: int = 0):
    """(embeddings float32 [count, dim], coarse labels, fine labels): item = coarse centre +
    fine offset (shared by every coarse cluster) + noise, each scale well apart, so residual
    k-means with 8 codes a level should find the coarse clusters at level 0 and the fine
    offsets at level 1."""
    rng = np.random.default_rng(seed)
    coarse = rng.normal(0.0, 40.0, (TOPS, dim))
    fine = rng.normal(0.0, 6.0, (SUBS, dim))
    top = rng.integers(0, TOPS, count)
    sub = rng.integers(0, SUBS, count)
    points = coarse[top] + fine[sub] + rng.normal(0.0, 0.3, (count, dim))
    return points.astype(np.float32), top, sub


def write_npy(folder: Path, embeddings: np.ndarray, ids: np.ndarray | None = None
              ) -> tuple[Path, Path | None]:
    source = folder / "items.npy"
    np.save(source, embeddings)
    id_path = None
    if ids is not None:
        id_path = folder / "ids.npy"
        np.save(id_path, ids)
    return source, id_path


def write_parquet(path: Path, ids, embeddings, fixed: bool = True, **extra) -> Path:
    """``item_id`` and ``embedding`` (fixed_size_list or list of float32) columns."""
    rows = np.asarray(embeddings, dtype=np.float32)
    values = pa.array(rows.reshape(-1))
    if fixed:
        column = pa.FixedSizeListArray.from_arrays(values, rows.shape[1])
    else:
        offsets = pa.array(np.arange(0, rows.size + 1, rows.shape[1], dtype=np.int32))
        column = pa.ListArray.from_arrays(offsets, values)
    pq.write_table(pa.table({"item_id": pa.array(ids), "embedding": column, **extra}), path)
    return path
