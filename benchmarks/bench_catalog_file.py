"""The catalog file at scale: write, read and check 10M rows in each format, beside the bare
library reads, then build the engine's tables and the TF table on the rows read.

    python -m benchmarks.bench_catalog_file --rows=10000000 --out=benchmarks/results

Per format (Parquet, ``.npz``): ``write_catalog`` (checks + write), ``read_catalog`` (read +
every rule), its anchor (``pyarrow.parquet.read_table`` + ``to_numpy`` / ``np.load``, no
checks) and the summary's path count; the median over ``--repeats``. Then, once, on the rows
read from the Parquet file: ``torch_engine.catalog.Catalog.from_arrays`` and
``custom_ops.SemanticIdTable.from_arrays`` (its file written, the C++ table initialised).
Items share code paths (``--paths_per_item`` distinct paths per item), as a residual
quantiser gives. Writes ``catalog_file_<date>.json`` and prints a table.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import custom_ops  # noqa: F401  (loads triton before tensorflow, which SemanticIdTable needs)
import numpy as np
from absl import app, flags

from benchmarks import results_file as rf
from xgr_checkpoint.catalog_file import read_catalog, write_catalog
from xgr_common.layout import TokenLayout

FLAGS = flags.FLAGS
flags.DEFINE_integer("rows", 10_000_000, "catalog rows (items)")
flags.DEFINE_float("paths_per_item", 0.25, "distinct code paths per item (collisions)")
flags.DEFINE_integer("repeats", 3, "timed runs of each write and read (median reported)")
flags.DEFINE_string("out", "benchmarks/results", "folder for catalog_file_<date>.json")
flags.DEFINE_string("work_dir", None, "where the files are written (default: a temp folder)")

FORMATS = ("parquet", "npz")


def make_catalog(rows: int, paths_per_item: float, layout: TokenLayout):
    """Shuffled unique ids [rows] int64 and codes [rows, levels] int32 sharing paths."""
    rng = np.random.default_rng(0)
    ids = rng.permutation(rows).astype(np.int64) * 3 + 7
    distinct = max(1, int(rows * paths_per_item))
    paths = rng.integers(0, layout.codebook_size, (distinct, layout.levels), dtype=np.int32)
    return ids, paths[rng.integers(0, distinct, rows)]


def timed(function, repeats: int):
    """(median seconds, last result) of ``repeats`` calls."""
    seconds, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), result


def bare_read(path: Path, levels: int):
    """The anchor: the same arrays with the library alone, no rule checked."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        names = ["item_id"] + [f"code_{level}" for level in range(levels)]
        table = pq.read_table(path, columns=names)
        return [table.column(name).to_numpy() for name in names]
    with np.load(path, allow_pickle=False) as archive:
        return [archive["item_id"], archive["codes"]]


def bench_format(fmt: str, folder: Path, ids, codes, layout: TokenLayout, repeats: int) -> dict:
    path = folder / f"catalog.{fmt}"
    write_s, _ = timed(lambda: write_catalog(path, ids, codes), repeats)
    read_s, catalog = timed(lambda: read_catalog(path, layout.levels, layout.codebook_size),
                            repeats)
    bare_s, _ = timed(lambda: bare_read(path, layout.levels), repeats)
    start = time.perf_counter()
    paths = catalog.num_paths
    summary_s = time.perf_counter() - start
    assert np.array_equal(catalog.item_ids, ids) and np.array_equal(catalog.item_codes, codes)
    return {"format": fmt, "write_s": write_s, "read_s": read_s, "bare_read_s": bare_s,
            "summary_s": summary_s, "file_mb": os.path.getsize(path) / 2**20,
            "num_paths": paths, "max_items_per_path": catalog.max_items_per_path,
            "catalog": catalog}


def bench_tables(catalog, layout: TokenLayout, folder: Path) -> dict:
    """The two tables export builds from the rows read."""
    from torch_engine.catalog import Catalog

    start = time.perf_counter()
    engine = Catalog.from_arrays(catalog.item_ids, catalog.item_codes, layout)
    engine_s = time.perf_counter() - start
    assert engine.num_prefixes[-1] == catalog.num_paths
    start = time.perf_counter()
    table = custom_ops.SemanticIdTable.from_arrays(folder / "catalog.xgrsid", catalog.item_ids,
                                                   catalog.item_codes, layout.codebook_size)
    table_s = time.perf_counter() - start
    assert int(table.size()) == catalog.num_items
    return {"engine_catalog_s": engine_s, "engine_tables_mb": engine.nbytes() / 2**20,
            "semantic_id_table_s": table_s}


def main(argv: list[str]) -> None:
    del argv
    layout = TokenLayout()
    ids, codes = make_catalog(FLAGS.rows, FLAGS.paths_per_item, layout)
    with tempfile.TemporaryDirectory(prefix="xgr_bench_catalog_", dir=FLAGS.work_dir) as work:
        folder = Path(work)
        rows = [bench_format(fmt, folder, ids, codes, layout, FLAGS.repeats) for fmt in FORMATS]
        tables = bench_tables(rows[0]["catalog"], layout, folder)
    for row in rows:
        del row["catalog"]
    result = {"date": rf.utc_now(), "cpu_count": os.cpu_count(), "rows": FLAGS.rows,
              "levels": layout.levels, "codebook_size": layout.codebook_size,
              "paths_per_item": FLAGS.paths_per_item, "repeats": FLAGS.repeats,
              "formats": rows, "tables_from_rows_read": tables,
              "versions": {"pyarrow": _version("pyarrow")}}
    path = rf.write_result(FLAGS.out, "catalog_file", result, indent=2)
    print(f"\n{FLAGS.rows} rows, {layout.levels} levels x {layout.codebook_size} codes, "
          f"{rows[0]['num_paths']} distinct paths (median of {FLAGS.repeats})")
    print(f"{'format':>8s} {'write s':>8s} {'read s':>7s} {'bare read s':>12s} "
          f"{'summary s':>10s} {'file MB':>8s}")
    for row in rows:
        print(f"{row['format']:>8s} {row['write_s']:8.2f} {row['read_s']:7.2f} "
              f"{row['bare_read_s']:12.2f} {row['summary_s']:10.2f} {row['file_mb']:8.0f}")
    print(f"on the rows read: Catalog.from_arrays {tables['engine_catalog_s']:.1f} s "
          f"({tables['engine_tables_mb']:.0f} MB of tables), SemanticIdTable "
          f"{tables['semantic_id_table_s']:.1f} s")
    print(f"wrote {path}")


def _version(name: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(name)


if __name__ == "__main__":
    app.run(main)
