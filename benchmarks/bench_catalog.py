"""Catalog construction at scale: build time, peak memory and table size on this machine's CPU.

    python -m benchmarks.bench_catalog --items=10000000 --out=benchmarks/results

Items get code paths with collisions (``--paths`` distinct paths, several items each), as a
residual quantiser produces. Each size is built in a fresh subprocess so its peak resident
memory (``ru_maxrss``) is its own. Writes ``catalog_<date>.json`` and prints a table.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from benchmarks import results_file as rf

FLAGS = flags.FLAGS
flags.DEFINE_list("items", ["1000000", "10000000"], "catalog sizes to build")
flags.DEFINE_float("paths_per_item", 0.25, "distinct code paths per item (collisions)")
flags.DEFINE_string("out", "benchmarks/results", "folder for catalog_<date>.json")
flags.DEFINE_integer("child", 0, "internal: build one catalog of this size and print JSON")


def build_once(items: int, paths_per_item: float) -> dict:
    """Build one catalog in this process; returns timings, sizes and peak memory."""
    from torch_engine.catalog import Catalog
    from xgr_common.layout import TokenLayout

    layout = TokenLayout()
    rng = np.random.default_rng(0)
    ids = rng.choice(np.arange(items * 3, dtype=np.int64), size=items, replace=False)
    distinct = max(1, int(items * paths_per_item))
    paths = rng.integers(0, layout.codebook_size, (distinct, layout.levels), dtype=np.int32)
    codes = paths[rng.integers(0, distinct, items)]
    inputs_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    catalog = Catalog.from_arrays(ids, codes, layout)
    seconds = time.perf_counter() - start
    return {"items": items, "build_s": seconds, "num_prefixes": list(catalog.num_prefixes),
            "max_items_per_path": catalog.max_items_per_path,
            "tables_mb": catalog.nbytes() / 2**20, "inputs_peak_rss_mb": inputs_rss,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: list[str]) -> None:
    del argv
    if FLAGS.child:
        print(json.dumps(build_once(FLAGS.child, FLAGS.paths_per_item)))
        return
    rows = []
    for items in FLAGS.items:
        out = subprocess.run([sys.executable, "-m", "benchmarks.bench_catalog", f"--child={items}",
                              f"--paths_per_item={FLAGS.paths_per_item}"],
                             check=True, capture_output=True, text=True, cwd=rf.ROOT)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"built {items} items in {rows[-1]['build_s']:.1f} s", flush=True)
    result = {"date": rf.utc_now(),
              "cpu_count": os.cpu_count(), "paths_per_item": FLAGS.paths_per_item, "rows": rows}
    path = rf.write_result(FLAGS.out, "catalog", result, indent=2)
    print(f"\n{'items':>10s} {'build s':>8s} {'paths':>9s} {'tables MB':>10s} {'peak RSS MB':>12s}")
    for row in rows:
        print(f"{row['items']:10d} {row['build_s']:8.1f} {row['num_prefixes'][-1]:9d} "
              f"{row['tables_mb']:10.0f} {row['peak_rss_mb']:12.0f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    app.run(main)
