"""``xgr catalog build`` as a user runs it: flags -> config -> one build, the summary printed,
the file then accepted by ``xgr catalog``; a bad file or flag ends with its message and exit
status 1 or 2, never a traceback."""

from __future__ import annotations

import numpy as np

from tests.catalog_build.items import planted, write_parquet
from tests.child_env import child_env
from tests.xgr_commands import run_commands


def test_build_then_check_and_refusals(tmp_path):
    points, _, _ = planted(count=1200)
    ids = np.arange(1200, dtype=np.int64) * 2
    source = write_parquet(tmp_path / "items.parquet", ids, points)
    broken = points.copy()
    broken[7, 3] = np.nan
    bad = write_parquet(tmp_path / "bad.parquet", ids, broken)
    out = tmp_path / "catalog.parquet"
    small = ["--levels", "2", "--codebook_size", "8", "--iterations", "5", "--noprogress"]
    results = run_commands([
        ["catalog", "build", str(source), "--out", str(out), "--max_items_per_path", "40",
         *small],
        ["catalog", str(out), "--levels", "2", "--codebook_size", "8"],
        ["catalog", "build", str(bad), "--out", str(tmp_path / "bad_out.npz"), *small],
        ["catalog", "build", str(source)],
        ["catalog", "build", str(source), "--out", str(out), "--max_items_per_path", "400"],
    ], env=child_env())
    (built, built_out, built_err), (check, checked, _), *refused = results
    assert built == 0, built_err
    for piece in (f"wrote {out}: 1200 items (Parquet column 'embedding', 16 dims) -> 2 levels "
                  f"x 8 codes, on cpu", "codes used per level:   8, 8 of 8",
                  "collisions (cap 40)", "reachability:           beam 256",
                  f"{tmp_path / 'catalog.report.png'}"):
        assert piece in built_out, built_out
    assert (tmp_path / "catalog.report.json").exists()
    assert check == 0 and "a valid parquet catalog for 2 levels x 8 codes" in checked
    assert "rows (items):            1200" in checked
    (nan_status, _, nan_err), (no_out, _, no_out_err), (over, _, over_err) = refused
    assert nan_status == 1 and "EmbeddingFileError" in nan_err, nan_err
    assert "row 7, column 'embedding': value nan at dimension 3" in nan_err
    assert not (tmp_path / "bad_out.npz").exists()
    assert no_out == 2 and "--out is required" in no_out_err
    assert over == 2 and "--max_items_per_path 400 is above --top_k 300" in over_err
    for _, _, err in results:
        assert "Traceback" not in err, err
