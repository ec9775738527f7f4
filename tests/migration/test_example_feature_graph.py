"""Example (b) end to end: the feature graph's dense stages move one by one with parity at each
step; the remaining stages are reported (custom ops to twins, string/table stages in TF)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# Heavy (runs the migration example in a fresh process): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_migrate_feature_graph_example(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))   # the plan names migrate_feature_graph:...
    sys.modules.pop("migrate_feature_graph", None)
    import migrate_feature_graph as example

    steps, report = example.run_example(tmp_path, batches=2, rows=4)
    assert [s.passed for s in steps] == [True] * 4, "\n".join(s.summary for s in steps)
    assert steps[0].torch_stages == ()
    assert steps[1].torch_stages == ("profile_tower",)
    assert steps[2].torch_stages == ("profile_tower", "profile_projection")
    assert {"clean_history", "assemble_prompt"} <= set(steps[3].torch_stages)
    for stage in ("semantic_ids", "context_lookup", "hash_ids"):
        assert f"{stage}: stays in TF" in report
    assert "a TF resource input (a table)" in report
    assert "strings cannot cross the DLPack bridge" in report
    assert "clean_history: converts (XgrCleanSequence)" in report
    assert "assemble_prompt: converts (XgrAssemblePrompt)" in report
    # Each step's report compares the moved stage's boundary, in float32, and the int outputs.
    markdown = (steps[2].report / "parity_report.md").read_text()
    assert "| profile_projection | output | float32 |" in markdown
    assert "| (model output) | token_ids | int32 |" in markdown
    final = (steps[3].report / "parity_report.md").read_text()
    assert "| assemble_prompt | output_0 | int32 |" in final and "FAIL" not in final
