"""A new catalog without a new engine package: the demo's files exported with a catalog
capacity (``--catalog_headroom``), then a catalog with items retired and added exported with
``--engine_from`` (no compile), verified against the Python pipeline over the new catalog,
served beside the first version under load (no failed request, one loaded package) and
refused when it breaks a catalog rule."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from tests.pipeline.conftest import export_team_files
from tests.serving.helpers import columnar, http, start_server
from tf_frontend.feature_graph import features_from_world
from xgr_checkpoint.catalog_file import read_catalog, write_catalog
from xgr_export.verify import run_fresh

# Heavy (an AOTInductor compile of the fitted model, fresh processes, a server).
pytestmark = pytest.mark.heavy

BEAMS, TOP_K, TOP_N, USERS, RETIRED, ADDED = 32, 20, 10, 16, 40, 30


def _export(xgr, out, files: dict, *extra: str):
    return export_team_files(xgr, out, files, BEAMS, TOP_K, TOP_N, *extra)


def _catalog(quick_model):
    layout = quick_model.settings.spec.layout
    arrays = read_catalog(quick_model.export_files()["catalog"], layout.levels,
                          layout.codebook_size)
    return arrays.item_ids, arrays.item_codes


@pytest.fixture(scope="module")
def versions(quick_model, xgr, tmp_path_factory):
    """(model base folder holding version 1, version 2 staged beside it, the retired ids, the
    added ids, both export reports). Version 2 retires the items the users below hold most
    often in their histories and adds items on the retired items' paths and on served ones."""
    root = tmp_path_factory.mktemp("catalog_versions")
    base, staged = root / "recs", root / "staged"
    base.mkdir()
    staged.mkdir()
    files = quick_model.export_files()
    done, first = _export(xgr, staged / "1", files, "--catalog_headroom=1.5",
                          "--verify_requests=8")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-4000:])
    os.rename(staged / "1", base / "1")   # a version appears whole

    ids, codes = _catalog(quick_model)
    features = features_from_world(quick_model.world, quick_model.settings.eval_users[:USERS])
    held, counts = np.unique(features["history_items"].numpy(), return_counts=True)
    retired = held[np.argsort(-counts)][:RETIRED]
    keep = ~np.isin(ids, retired)
    added = np.arange(ADDED, dtype=np.int64) + ids.max() + 1
    # New items on the retired items' paths and on the paths of some kept items.
    new_codes = np.concatenate([codes[~keep], codes[keep][:ADDED]])[:ADDED]
    second = write_catalog(root / "catalog_v2.parquet", np.concatenate([ids[keep], added]),
                           np.concatenate([codes[keep], new_codes]))
    started = time.perf_counter()
    done, report = _export(xgr, staged / "2", {**files, "catalog": second},
                           f"--engine_from={base / '1'}", "--verify_requests=8")
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-4000:])
    report["wall_seconds"] = time.perf_counter() - started
    return base, staged / "2", retired, added, first, report, done.stdout


def test_the_first_export_records_its_capacity_and_verifies(versions):
    first = versions[4]
    assert first["verify"]["ok"] and first["verify"]["rows_exact"] == 8
    capacity = first["capacity"]
    assert capacity["items"] >= 1.5 * first["num_items"]
    assert "table catalog.path_items" in first["engine_signature"]


def test_a_new_catalog_reuses_the_package_and_verifies(versions):
    base, staged, _, _, first, second, stdout = versions
    assert second["engine_from"] == str(base / "1") and second["package_shared"]
    assert second["verify"]["ok"] and second["verify"]["rows_exact"] == 8
    assert second["num_items"] == first["num_items"] - RETIRED + ADDED
    assert second["capacity"] == first["capacity"]
    assert second["engine_signature"] == first["engine_signature"]
    # No compile: the tables alone are written, the package is the first version's file.
    assert "reused (hard-linked" in stdout
    package = staged / "assets" / "engine.pt2"
    assert package.stat().st_ino == (base / "1" / "assets" / "engine.pt2").stat().st_ino


def test_the_new_version_never_returns_retired_items(versions, quick_model):
    _, staged, retired, added, *_ = versions
    features = features_from_world(quick_model.world, quick_model.settings.eval_users[:USERS])
    got = run_fresh(staged, features)
    returned = got["item_ids"][got["item_ids"] >= 0]
    assert returned.size and not np.isin(returned, retired).any()


def test_a_catalog_that_changes_codes_or_outgrows_the_capacity_is_refused(
        versions, quick_model, xgr, tmp_path):
    base = versions[0]
    files = quick_model.export_files()
    ids, codes = _catalog(quick_model)
    recoded = codes.copy()
    recoded[:5] = codes[5:10]
    changed = recoded[:5] != codes[:5]
    assert changed.any()
    catalog = write_catalog(tmp_path / "recoded.parquet", ids, recoded)
    done, _ = _export(xgr, tmp_path / "recoded", {**files, "catalog": catalog},
                      f"--engine_from={base / '1'}")
    assert done.returncode != 0 and "change their codes" in done.stderr, done.stderr[-2000:]

    grown_ids = np.arange(2 * ids.size, dtype=np.int64) + ids.max() + 1
    grown = write_catalog(tmp_path / "grown.parquet", np.concatenate([ids, grown_ids]),
                          np.concatenate([codes, codes, codes]))
    done, _ = _export(xgr, tmp_path / "grown", {**files, "catalog": grown},
                      f"--engine_from={base / '1'}")
    assert done.returncode != 0, done.stdout[-2000:]
    assert "over the capacity" in done.stderr and "items" in done.stderr, done.stderr[-2000:]


def test_the_new_catalog_goes_live_under_load_without_a_failed_request(versions, quick_model):
    """Version 2 appears in the model folder while clients send requests: every request is
    answered (200), version 2 takes over, and both versions hold one loaded package."""
    from custom_ops.torch_call import package_stats

    base, staged, retired, *_ = versions
    users = quick_model.settings.eval_users[:USERS]
    request = {"inputs": columnar({k: (v.numpy().astype(object) if k == "country"
                                       else v.numpy())
                                   for k, v in features_from_world(quick_model.world,
                                                                   users).items()})}
    server = start_server(str(base), file_system_poll_wait_seconds=0.2)
    statuses, answers, stop = [], [], threading.Event()

    def client():
        while not stop.is_set():
            status, body = http(server.rest_port, "/v1/models/recs:predict", request)
            statuses.append(status)
            if status == 200:
                answers.append(np.asarray(body["outputs"]["item_ids"]))

    try:
        workers = [threading.Thread(target=client) for _ in range(3)]
        for worker in workers:
            worker.start()
        time.sleep(2)
        started = time.perf_counter()
        os.rename(staged, base / "2")
        swap = None
        while time.perf_counter() - started < 300:
            _, body = http(server.rest_port, "/v1/models/recs")
            states = {int(v["version"]): v["state"] for v in body["model_version_status"]}
            if states.get(2) == "AVAILABLE":
                swap = time.perf_counter() - started
                break
            time.sleep(0.2)
        time.sleep(2)               # requests the old version had begun are answered by now
        before = len(answers)
        deadline = time.perf_counter() + 120
        while len(answers) < before + 3 and time.perf_counter() < deadline:
            time.sleep(0.1)
        stop.set()
        for worker in workers:
            worker.join(timeout=120)
        loaded = [path for path in package_stats() if path.startswith(str(base))]
    finally:
        stop.set()
        server.stop()
    assert swap is not None, "version 2 never became available"
    assert statuses and set(statuses) == {200}, sorted(set(statuses))
    late = np.concatenate([a.ravel() for a in answers[before:]])
    assert late.size and not np.isin(late, retired).any()
    assert len(loaded) == 1, loaded
    print(f"catalog version live {swap:.1f} s after it appeared; {len(statuses)} requests, "
          f"none failed")
