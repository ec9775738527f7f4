"""``xgr migrate`` and ``xgr parity`` driven as a user drives them.

Each subcommand runs in its own process, as in real use (``tests/xgr_commands.py``): one helper
process runs a sequence of ``xgr migrate`` commands, importing TF once.
"""

from __future__ import annotations

import html
import json
import subprocess
import sys
from pathlib import Path

import pytest
import toy_models

from bridge.parity.data import save_npz
from bridge.parity.pytest_helper import assert_parity
from tests.child_env import child_env
from tests.xgr_commands import run_commands

# Heavy (runs `xgr migrate` and `xgr parity` in fresh processes): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[2]
ENV = child_env(Path(__file__).parent)  # toy_models


def xgr(*commands: list[str], env: dict | None = None) -> list[tuple[int, str, str]]:
    """Run each ``xgr migrate`` command (a list of arguments) in order, in one fresh process
    (with ``env``, default: the suite's, which imports ``toy_models``)."""
    return run_commands(list(commands), env or ENV)


@pytest.fixture()
def plan_path(tmp_path):
    save_npz(tmp_path / "batches.npz", toy_models.mlp_batches(2))
    return tmp_path / "plan.json"


def test_init_swap_auto_status_revert_and_bad_requests(plan_path):
    p = ["--plan", str(plan_path)]
    init, swap, auto, status, revert, no_module, unknown, bad_action, again = xgr(
        ["migrate", "init", "--model", "toy_models:mlp", *p],
        ["migrate", "swap", "hidden", "--module", "bridge.migration.keras_twins:Dense", *p],
        ["migrate", "auto", "head", *p],
        ["migrate", "status", *p],
        ["migrate", "revert", "hidden", *p],
        ["migrate", "swap", "hidden", *p],
        ["migrate", "swap", "nope", "--module", "torch.nn:Identity", *p],
        ["migrate", "frobnicate", *p],
        ["migrate", "init", "--model", "toy_models:mlp", *p])
    assert [init[0], swap[0], auto[0], status[0], revert[0]] == [0] * 5, (swap, auto)
    assert "0 of 4 stages in Torch" in init[1]
    assert "2 of 4 stages in Torch" in status[1] and "converted/head" in status[1]
    assert "head: converted, now runs in Torch" in auto[1]
    # Bad requests exit non-zero, say why, and leave the plan as it was.
    assert no_module[0] == 1 and "swap needs --module" in no_module[2]
    assert unknown[0] == 1 and "stages the model lacks: ['nope']" in unknown[2]
    assert bad_action[0] == 2 and "usage: xgr migrate" in bad_action[2]
    assert again[0] == 1 and "pass --force" in again[2]
    assert json.loads(plan_path.read_text())["stages"] == {
        "head": {"runtime": "torch", "converted": "converted/head"}}
    assert (plan_path.parent / "converted/head/graph.json").is_file()
    assert assert_parity(plan_path, plan_path.parent / "batches.npz").passed


def test_auto_reports_every_unconvertible_stage_at_once(tmp_path):
    plan = ["--plan", str(tmp_path / "plan.json")]
    _, (code, out, _) = xgr(["migrate", "init", "--model", "toy_models:with_unconvertible", *plan],
                            ["migrate", "auto", "--dry_run", *plan])
    assert code == 1
    assert "5 of 7 stages cannot convert and stay in TF" in out
    for stage in ("country_lookup", "user_lookup", "user_hash", "exact_gelu", "bucketize"):
        assert f"{stage}: stays in TF" in out
    assert "dense_ok: converts" in out and "ids: converts" in out
    assert json.loads((tmp_path / "plan.json").read_text())["stages"] == {}, \
        "--dry_run leaves the plan alone"


def test_broken_torch_module_fails_parity_and_the_report_names_its_stage(plan_path):
    p = ["--plan", str(plan_path)]
    results = xgr(["migrate", "init", "--model", "toy_models:mlp", *p],
                  ["migrate", "auto", "hidden", *p],
                  ["migrate", "swap", "middle", "--module", "toy_models:BrokenDense", *p])
    assert [r[0] for r in results] == [0, 0, 0], results
    report_dir = plan_path.parent / "report"
    proc = subprocess.run([sys.executable, "-m", "xgr_cli.main", "parity", *p, "--data",
                           str(plan_path.parent / "batches.npz"), "--report_dir", str(report_dir)],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
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


def test_subcommand_help_lists_the_subcommands_own_flags():
    [(code, out, err)] = xgr(["migrate", "--help"])
    assert code == 0, err
    assert out.startswith("usage: xgr migrate [--flags]")
    assert "--plan" in out and "xgr_cli.migrate" in out
    assert "--only_check_args" not in out  # absl's own flags stay behind --helpfull
