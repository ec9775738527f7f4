"""A pytest fixture for parity checks in a team's own suite.

Enable it in the suite's top-level ``conftest.py``::

    pytest_plugins = ["bridge.parity.pytest_plugin"]

    def test_tower_migration(parity):
        parity("migration/plan.json", "migration/batches.npz")

``parity(plan, data, **kwargs)`` is :func:`bridge.parity.pytest_helper.assert_parity` with the
report written under the test's ``tmp_path`` (``parity_report/``), whose path the failure
message names.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from bridge.parity.harness import ParityResult
from bridge.parity.pytest_helper import assert_parity


@pytest.fixture()
def parity(tmp_path) -> Callable[..., ParityResult]:
    def check(plan: Any, data: Any, **kwargs: Any) -> ParityResult:
        kwargs.setdefault("report_dir", tmp_path / "parity_report")
        return assert_parity(plan, data, **kwargs)
    return check
