"""The rate sweep of the session-load benchmarks: which rates run, and which one counts."""

from pathlib import Path

import pytest

import numpy as np

from benchmarks.session_load import Answer, SessionWorld, best_rate, sweep


def _row(rate, p99, failed=0):
    return {"rate": rate, "p99_ms": p99, "failed": failed, "throughput": rate * 0.9}


def test_the_sweep_runs_rates_upwards_and_ends_at_the_first_past_the_bound():
    p99 = {10.0: 50.0, 20.0: 90.0, 30.0: 250.0, 40.0: 60.0}
    ran = []

    def run(rate):
        ran.append(rate)
        return _row(rate, p99[rate])

    rows = sweep([30.0, 10.0, 40.0, 20.0], run, 200.0)
    assert ran == [10.0, 20.0, 30.0]       # 40 is never run: it could not count
    assert best_rate(rows, 200.0) == 18.0


def test_a_failed_request_or_no_answer_ends_the_sweep_too():
    assert [r["rate"] for r in sweep([1, 2, 3], lambda r: _row(r, 10.0, failed=r == 2),
                                     100.0)] == [1, 2]
    assert [r["rate"] for r in sweep([1, 2], lambda r: _row(r, None), 100.0)] == [1]
    assert best_rate(sweep([1, 2], lambda r: _row(r, None), 100.0), 100.0) is None


def test_every_rate_runs_while_the_server_keeps_up():
    rows = sweep([5, 15, 10], lambda r: _row(r, 20.0), 100.0)
    assert [r["rate"] for r in rows] == [5, 10, 15] and best_rate(rows, 100.0) == 13.5


def _history_lengths(world: SessionWorld) -> list[tuple[int, int]]:
    ids = np.arange(10_000, 10_500)
    out = []
    for request in world.user_requests(ids, np.random.default_rng(0)):
        times, day = request["history_times"], request["request_time"][0] // 86400
        recent = int((times // 86400 == day).sum())
        out.append((len(times) - recent, recent))
    return out


def test_a_spread_gives_users_many_history_lengths_within_the_card():
    same = _history_lengths(SessionWorld("tiny", 500, 100, 40, 12, 30, 1.0))
    assert set(same) == {(40, 12)}
    spread = _history_lengths(SessionWorld("tiny", 500, 100, 40, 12, 30, 1.0, 0.5))
    longs, recents = zip(*spread)
    assert min(longs) >= 20 and max(longs) <= 40 and len(set(longs)) > 10
    assert min(recents) >= 6 and max(recents) <= 12 and len(set(recents)) > 3
    with pytest.raises(ValueError, match="length_spread"):
        SessionWorld("tiny", 500, 100, 40, 12, 30, 1.0, 1.0)


def _exported(monkeypatch, tmp_path, code: int, saved: bool, report: bool):
    import json
    import subprocess
    from types import SimpleNamespace

    from benchmarks import session_load
    out = tmp_path / "cached"

    def run(argv, **kwargs):
        out.mkdir()
        if saved:
            (out / "saved_model.pb").write_bytes(b"")
        if report:
            (tmp_path / "cached.report.json").write_text(json.dumps({"verify": {"ok": False}}))
        return SimpleNamespace(returncode=code, stdout="verify: items DIFFERENT", stderr="boom")

    monkeypatch.setattr(subprocess, "run", run)
    files = {"model": "m", "catalog": "c", "feature_graph": "g"}
    return session_load.export(files, out, session_load.ExportSettings("cpu", 16, 12, 4, 0))


def test_an_export_whose_check_differs_is_served_and_its_check_recorded(
        monkeypatch, tmp_path, capsys):
    assert _exported(monkeypatch, tmp_path, 1, True, True) == {"verify": {"ok": False}}
    assert "found different items" in capsys.readouterr().out


@pytest.mark.parametrize("code, saved, report", [(1, False, True), (1, True, False),
                                                 (2, True, True)])
def test_an_export_that_did_not_save_and_report_fails_the_benchmark(
        monkeypatch, tmp_path, code, saved, report):
    with pytest.raises(RuntimeError, match="xgr export failed"):
        _exported(monkeypatch, tmp_path, code, saved, report)


def test_a_version_that_fails_to_load_ends_the_wait_and_its_server(monkeypatch, tmp_path):
    """The wait for a server ends at the model status's error, not at its time limit, and
    the server is stopped: a failed start never leaves a process holding the device."""
    import time

    from benchmarks import session_load

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "saved_model.pb").write_bytes(b"not a SavedModel")
    stopped = []
    real_stop = session_load.stop_server
    monkeypatch.setattr(session_load, "stop_server",
                        lambda process: stopped.append(process) or real_stop(process))
    started = time.monotonic()
    with pytest.raises(session_load.ServerNotServing, match="version 1 failed to load: .*log: "):
        session_load.Server(bad, tmp_path, "bad", 4, 1000)
    assert time.monotonic() - started < 120
    (process,) = stopped
    assert process.poll() is not None


def test_a_server_that_dies_loading_is_reported_with_its_log(monkeypatch, tmp_path):
    """A server that crashes while loading its first version (before it prints its ports)
    is a ``ServerNotServing`` carrying the log's error lines, so the benchmark records it and
    goes on instead of ending in a traceback."""
    from benchmarks import session_load

    saved = tmp_path / "saved"
    saved.mkdir()

    def crashing_start(base, log_path, *args, **kwargs):
        Path(log_path).write_text(
            "loading model version\nError: CUDA driver error: an illegal memory access\n"
            "terminate called after throwing an instance of 'c10::AcceleratorError'\n"
            "  what():  CUDA error: an illegal memory access was encountered\n"
            "frame #0: c10::Error::Error\nFatal Python error: Aborted\n")
        raise RuntimeError("xgr serve did not start: ''")

    monkeypatch.setattr(session_load, "start_server", crashing_start)
    with pytest.raises(session_load.ServerNotServing) as raised:
        session_load.Server(saved, tmp_path, "cached", 4, 1000)
    message = str(raised.value)
    assert "did not start" in message and "what():  CUDA error: an illegal memory" in message
    assert "Fatal Python error: Aborted" in message and "frame #0" not in message
    assert session_load.log_errors(tmp_path / "missing.log") == "(no log)"


def test_two_servers_answers_are_compared_by_the_tolerance_tables_rule():
    want = Answer(np.array([5, 9, 2, 7]), np.array([-1.0, -2.0, -3.0, -3.0], np.float32))
    swapped_tie = Answer(np.array([5, 9, 7, 2]), np.array([-1.0, -2.0, -3.0, -3.0], np.float32))
    other_item = Answer(np.array([5, 8, 2, 7]), np.array([-1.0, -2.0, -3.0, -3.0], np.float32))
    tail_swap = Answer(np.array([5, 9, 2, 8]), np.array([-1.0, -2.0, -3.0, -3.0], np.float32))
    low_score = Answer(np.array([5, 9, 2, 7]), np.array([-1.0, -2.5, -3.0, -3.0], np.float32))
    # At 16 bits items tied within the rounding may swap; nothing else may change.
    assert not swapped_tie.breaks(want, "bfloat16")
    assert not tail_swap.breaks(want, "bfloat16")    # tied with the last: cut either way
    assert other_item.breaks(want, "bfloat16") and low_score.breaks(want, "bfloat16")
    assert not want.breaks(want, "bfloat16")
    # At float32 every item must be the same.
    assert swapped_tie.breaks(want, "float32") and not want.breaks(want, "float32")
    assert Answer(np.array([5, 9]), np.array([-1.0, -2.0])).breaks(want, "bfloat16")


def test_an_exports_check_is_kept_in_figures_with_each_sides_drift():
    from dataclasses import replace

    from benchmarks.session_load import export_check_figures
    from xgr_export.verify import compare

    def outputs(items, scores):
        return {"item_ids": np.array([items], np.int64),
                "scores": np.array([scores], np.float32), "num_items": np.array([4], np.int32)}

    failed = compare(outputs([5, 9, 8, 2], [-1.0, -2.01, -2.5, -4.0]),
                     outputs([5, 7, 8, 2], [-1.0, -2.0, -2.5, -4.0]), dtype="bfloat16")
    report = {"verify": replace(failed, saved_drift=0.4, engine_drift=0.05,
                               precise_rows_broken=1).to_json()}
    figures = export_check_figures(report)
    assert figures == {"ok": False, "max_score_error": failed.max_score_error,
                       "score_atol": failed.score_atol, "saved_drift": 0.4,
                       "engine_drift": 0.05, "precise_rows_broken": 1}
    assert export_check_figures({"saved_model": "m"}) is None     # verified nothing
