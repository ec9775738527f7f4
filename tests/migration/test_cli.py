"""``xgr migrate`` and ``xgr parity`` driven as a user drives them.

``xgr migrate`` calls go through ``bridge.cli.main.run`` in this process, with absl flags
restored after each (``flagsaver``). ``xgr parity`` defines flags of the same names, so (as in
real use, one subcommand per process) it runs as a separate ``python -m bridge.cli.main``
process, exactly as CI would call it.
"""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import toy_models
from absl.testing import flagsaver

import bridge.cli.migrate  # noqa: F401  (defines its flags once, outside flagsaver)
from bridge.cli.main import run
from bridge.parity.data import save_npz
from bridge.parity.pytest_helper import assert_parity

ROOT = Path(__file__).resolve().parents[2]


def xgr(*args: str) -> int:
    """Run ``xgr ARGS`` in-process; returns the exit status."""
    with flagsaver.flagsaver(), pytest.raises(SystemExit) as exit_info:
        run(["xgr", *args])
    return exit_info.value.code or 0


@pytest.fixture()
def plan_path(tmp_path):
    path = tmp_path / "plan.json"
    assert xgr("migrate", "init", "--plan", str(path), "--model", "toy_models:mlp") == 0
    save_npz(tmp_path / "batches.npz", toy_models.mlp_batches(2))
    return path


def test_swap_auto_revert_and_status(plan_path, capsys):
    p = ["--plan", str(plan_path)]
    assert xgr("migrate", "swap", "hidden", "--module",
               "bridge.migration.keras_twins:Dense", *p) == 0
    assert xgr("migrate", "auto", "head", *p) == 0
    stages = json.loads(plan_path.read_text())["stages"]
    assert stages == {"hidden": {"runtime": "torch", "module": "bridge.migration.keras_twins:Dense"},
                      "head": {"runtime": "torch", "converted": "converted/head"}}
    assert (plan_path.parent / "converted/head/graph.json").is_file()
    capsys.readouterr()
    assert xgr("migrate", "status", *p) == 0
    out = capsys.readouterr().out
    assert "2 of 4 stages in Torch" in out and "converted/head" in out
    assert_parity(plan_path, plan_path.parent / "batches.npz")
    assert xgr("migrate", "revert", "hidden", *p) == 0
    assert list(json.loads(plan_path.read_text())["stages"]) == ["head"]


def test_bad_requests_exit_non_zero_with_the_reason(plan_path, capsys):
    p = ["--plan", str(plan_path)]
    assert xgr("migrate", "swap", "hidden", *p) == 1
    assert "swap needs --module" in capsys.readouterr().err
    assert xgr("migrate", "swap", "nope", "--module", "torch.nn:Identity", *p) == 1
    assert "stages the model lacks: ['nope']" in capsys.readouterr().err
    assert xgr("migrate", "frobnicate", *p) == 2
    assert xgr("migrate", "init", "--model", "toy_models:mlp", *p) == 1
    assert "pass --force" in capsys.readouterr().err


def test_auto_reports_every_unconvertible_stage_at_once(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert xgr("migrate", "init", "--plan", str(plan), "--model",
               "toy_models:with_unconvertible") == 0
    capsys.readouterr()
    assert xgr("migrate", "auto", "--dry_run", "--plan", str(plan)) == 1
    out = capsys.readouterr().out
    assert "5 of 7 stages cannot convert and stay in TF" in out
    for stage in ("country_lookup", "user_lookup", "user_hash", "exact_gelu", "bucketize"):
        assert f"{stage}: stays in TF" in out
    assert "dense_ok: converts" in out
    assert json.loads(plan.read_text())["stages"] == {}, "--dry_run leaves the plan alone"


def test_broken_torch_module_fails_parity_and_the_report_names_its_stage(plan_path):
    p = ["--plan", str(plan_path)]
    assert xgr("migrate", "auto", "hidden", *p) == 0
    assert xgr("migrate", "swap", "middle", "--module", "toy_models:BrokenDense", *p) == 0
    report_dir = plan_path.parent / "report"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)])}
    proc = subprocess.run([sys.executable, "-m", "bridge.cli.main", "parity", *p, "--data",
                           str(plan_path.parent / "batches.npz"), "--report_dir", str(report_dir)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "first failing stage 'middle', output 'output', dtype float32, shape [5, 8]" in proc.stdout
    markdown = (report_dir / "parity_report.md").read_text()
    first = next(line for line in markdown.splitlines() if "first failure" in line)
    assert "| middle | output | float32 | 5x8 |" in first and "FAIL" in first
    assert "| hidden | output | float32 | 5x16 |" in markdown   # the converted stage passed
    page = html.unescape((report_dir / "parity_report.html").read_text())
    assert "first failing stage 'middle'" in page and '<tr style="background:#fde0e0">' in page
    pngs = sorted(p.name for p in (report_dir / "histograms").glob("*.png"))
    assert "middle__output.png" in pngs and len(pngs) == 5
