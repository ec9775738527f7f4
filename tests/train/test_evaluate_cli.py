"""``xgr evaluate`` end to end on the quick demo model's files and a log written from its world:
the table, the JSON report and the plot, the splits, skipped and capped requests, refusals;
and the demo fit, which learned the world's planted preferences, above popularity."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.child_env import child_env
from tests.xgr_commands import run_commands

# Heavy: the session's quick fit (``quick_model``, tests/conftest.py) and fresh `xgr evaluate`
# processes.
pytestmark = pytest.mark.heavy

EXTRA_USERS = 3   # users whose test event is an item outside the catalog


def world_log(fitted, path: Path) -> int:
    """The held-out users' events (history, then the held-out next item at its request time)
    as a behaviour log, plus ``EXTRA_USERS`` users whose event after the cut is an item
    outside the catalog; returns the cut (the first request time)."""
    from xgr_train.logs import write_logs

    world, users = fitted.world, fitted.settings.eval_users
    cut = int(world.request_time[users].min())
    ids, items, times, contexts = [], [], [], []
    for row in users:
        span = slice(world.history_splits[row], world.history_splits[row + 1])
        count = span.stop - span.start + 1
        ids += [world.user_ids[row]] * count
        items += [*world.history_items[span], world.target_items[row]]
        times += [*world.history_times[span], world.request_time[row]]
        contexts += [world.user_context[row]] * count
    assert max(world.history_times) < cut
    for user in range(1, EXTRA_USERS + 1):
        ids += [user, user]
        items += [int(world.item_ids[0]), 1]   # item 1 is no catalog item
        times += [cut - 100, cut + 10]
        contexts += [b"us", b"us"]
    write_logs(path, np.asarray(ids), np.asarray(items), np.asarray(times),
               np.asarray(contexts, dtype=object))
    return cut


@pytest.fixture(scope="module")
def runs(quick_model, tmp_path_factory):
    """(cut, out folder, [(exit status, stdout, stderr)]) of the ``xgr evaluate`` commands,
    run in one fresh process."""
    folder = tmp_path_factory.mktemp("evaluate")
    logs = folder / "log.parquet"
    cut = world_log(quick_model, logs)
    files = quick_model.export_files()
    team = [f"--model={files['model']}", f"--catalog={files['catalog']}",
            f"--feature_graph={files['feature_graph']}"]
    out = folder / "out"
    commands = [
        ["evaluate", *team, f"--logs={logs}", "--split=time", f"--test_from={cut}",
         f"--out={out}", "--batch_size=100", "--progress=false"],
        ["evaluate", *team, f"--logs={logs}", "--split=users", "--holdout=0.2",
         "--k=5,10", "--top_k=10", "--beam_width=32", "--max_requests=40",
         "--cooccurrence_items=2", "--progress=false"],
        ["evaluate", *team, f"--logs={folder / 'none.parquet'}"],
        ["evaluate", f"--model={files['model']}", f"--catalog={files['catalog']}",
         f"--logs={logs}"],
        ["evaluate", *team, f"--logs={logs}", "--k=10,200"],
    ]
    results = run_commands(commands, child_env(TF_CPP_MIN_LOG_LEVEL="3"), timeout=900)
    return cut, out, results


def test_time_split_prints_the_table_and_writes_report_and_plot(runs, quick_model):
    cut, out, results = runs
    code, stdout, stderr = results[0]
    assert code == 0, stderr[-3000:]
    report = json.loads((out / "evaluation.json").read_text())
    assert (out / "evaluation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["split"] == {"kind": "time", "test_from": cut, "test_until": cut + 86400}
    held = len(quick_model.settings.eval_users)
    assert (report["requests"], report["outside_catalog"], report["capped"]) == (held, 3, 0)
    assert report["candidates"] == held + EXTRA_USERS
    # Only the events before the cut are counted: every history, and the extra users' first.
    assert report["train_events"] == held * quick_model.settings.world.history_events + 3
    assert f"time split: test on [{cut}, {cut + 86400}); {held} requests evaluated (3 " \
           f"skipped: target outside the catalog" in stdout
    for k in (1, 5, 10, 20, 50, 100):
        values = [report[m][r][str(k)] for m in ("recall", "ndcg")
                  for r in ("model", "popularity", "co-occurrence")]
        assert re.search(rf"^\s*{k}" + "".join(rf"\s+{v:.4f}" for v in values) + r"\s*$",
                         stdout, re.M), k
        for ranker in ("model", "popularity", "co-occurrence"):
            assert report["ndcg"][ranker][str(k)] <= report["recall"][ranker][str(k)]
    assert f"wrote plot: {out / 'evaluation.png'}" in stdout


def test_the_fit_that_learned_the_planted_pattern_beats_popularity(runs):
    """The demo world plants each user's preferred categories; the quick fit learned them
    from the training users and ranks the held-out users' next items above popularity."""
    _, out, _ = runs
    report = json.loads((out / "evaluation.json").read_text())
    for metric in ("recall", "ndcg"):
        for k in ("10", "50", "100"):
            model, popular = report[metric]["model"][k], report[metric]["popularity"][k]
            assert model > popular, (metric, k, model, popular)


def test_users_split_caps_the_requests(runs):
    _, _, results = runs
    code, stdout, stderr = results[1]
    assert code == 0, stderr[-3000:]
    found = re.search(r"users split: (\d+) held-out users \(holdout 0.2, seed 0\); 40 requests "
                      r"evaluated \((\d+) skipped: target outside the catalog; (\d+) left out "
                      r"by max_requests\)", stdout)
    assert found, stdout
    held, skipped, capped = map(int, found.groups())
    assert held == round(0.2 * 303) and held - skipped - capped == 40
    assert re.search(r"^\s*5(\s+\d\.\d{4}){6}\s*$", stdout, re.M)
    assert "wrote" not in stdout


def test_bad_inputs_are_refused_with_the_reason(runs):
    _, _, results = runs
    assert [code for code, _, _ in results[2:]] == [1, 1, 1]
    assert "xgr evaluate: ConfigError: behaviour log" in results[2][2]
    assert "does not exist" in results[2][2]
    assert "xgr evaluate needs --feature_graph" in results[3][2]
    assert "ks (10, 200) go beyond top_k 100" in results[4][2]
