"""``experiments.package_child``: the inputs reach the child, its JSON comes back, and a
failing child comes back as its error instead of an exception."""

from __future__ import annotations

from experiments.package_child import run_package_child

_ECHO = r"""
import json, sys
import torch
package, inputs, out = sys.argv[1:]
a = torch.load(inputs)
json.dump({"package": package, "total": int(a["x"].sum())}, open(out, "w"))
"""


def test_the_child_reads_the_inputs_and_returns_its_json(tmp_path):
    import torch
    got = run_package_child(_ECHO, tmp_path / "p.pt2", {"x": torch.arange(5)}, tmp_path, 60)
    assert got == {"package": str(tmp_path / "p.pt2"), "total": 10}


def test_a_failing_child_is_its_error(tmp_path):
    got = run_package_child("raise SystemExit('no package here')", tmp_path / "p.pt2", {},
                            tmp_path, 60)
    assert "no package here" in got["child_error"]
