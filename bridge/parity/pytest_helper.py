"""``assert_parity``: the parity check for a team's own test suite.

    from bridge.parity.pytest_helper import assert_parity

    def test_tower_migration(tmp_path):
        assert_parity("migration/plan.json", "migration/batches.npz", report_dir=tmp_path)

Raises :class:`xgr_common.errors.ParityError` (an ``AssertionError``, so pytest shows it as a
test failure) naming the first failing stage, output, dtype, shape and max abs/rel error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from bridge.migration.plan import MigrationPlan, load_plan
from bridge.migration.runner import PlanRunner
from bridge.parity.data import load_batches
from bridge.parity.harness import ParityResult, run_parity
from xgr_common.errors import ParityError


def check_parity(plan: str | Path | MigrationPlan,
                 data: str | Path | Sequence[Mapping[str, Any]], *,
                 plan_dir: str | Path | None = None, report_dir: str | Path | None = None,
                 batch_size: int = 32) -> ParityResult:
    """Run the parity harness; writes a report when ``report_dir`` is given. Never raises for
    disagreement (see :func:`assert_parity`)."""
    if isinstance(plan, MigrationPlan):
        plan_dir = Path(plan_dir or ".")
    else:
        plan_dir = Path(plan_dir or Path(plan).parent)
        plan = load_plan(plan)
    runner = PlanRunner(plan, plan_dir)
    batches = load_batches(data, runner.model, batch_size) if isinstance(data, (str, Path)) \
        else list(data)
    result = run_parity(runner, batches, progress=False)
    if report_dir is not None:
        from bridge.parity.report import write_report
        write_report(result, report_dir, f"Parity of {plan.model}")
    return result


def assert_parity(plan: str | Path | MigrationPlan,
                  data: str | Path | Sequence[Mapping[str, Any]], **kwargs: Any) -> ParityResult:
    """Like :func:`check_parity`, raising ``ParityError`` when any boundary disagrees."""
    result = check_parity(plan, data, **kwargs)
    if not result.passed:
        where = f"\nreport: {kwargs['report_dir']}" if kwargs.get("report_dir") else ""
        raise ParityError(result.summary() + where)
    return result
