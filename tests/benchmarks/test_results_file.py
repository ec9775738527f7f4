"""The result writer every benchmark and probe writes through: the file name, and the run's
provenance in the JSON (commit and dirty flag, machine, library versions), with git, without
it (a copy of the tree without ``.git``, as on the GPU machine) and from ``XGR_COMMIT``."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess

import pytest
import torch

from benchmarks import results_file as rf

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(root, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    """A one-commit git repository with one tracked file, ``tracked.txt``."""
    root = tmp_path / "checkout"
    root.mkdir()
    _git(root, "init", "-q")
    (root / "tracked.txt").write_text("one\n")
    _git(root, "add", "tracked.txt")
    _git(root, "-c", "user.name=bench", "-c", "user.email=bench@example.com", "commit", "-q",
         "-m", "one")
    return root


@needs_git
def test_write_result_names_the_file_and_records_the_provenance(tmp_path):
    path = rf.write_result(tmp_path / "out", "engine", {"date": rf.utc_now(), "rows": [1.5]},
                           tag="main")
    today = datetime.date.today().isoformat()
    assert path == str(tmp_path / "out" / f"engine_{today}_main.json")
    result = json.loads(open(path).read())
    assert list(result)[:4] == ["commit", "dirty", "machine", "versions"]
    if os.environ.get(rf.COMMIT_VARIABLE):
        assert result["commit"] == os.environ[rf.COMMIT_VARIABLE]
    elif (rf.ROOT / ".git").exists():
        assert result["commit"] == _git(rf.ROOT, "rev-parse", "HEAD")
        assert isinstance(result["dirty"], bool)
    else:  # a copy of the tree (the GPU machine's)
        assert result["commit"] == "unknown"
    assert result["rows"] == [1.5]
    versions = result["versions"]
    assert versions["python"] == platform.python_version()
    assert versions["torch"] == torch.__version__
    if torch.cuda.is_available():
        assert result["machine"] == torch.cuda.get_device_name()
    else:
        assert result["machine"].endswith(" cores)")


@needs_git
@pytest.mark.parametrize("change, dirty", [
    (None, False),
    ("tracked.txt", True),        # a tracked file edited
    ("new_result.json", False),   # an untracked file (a fresh result) does not count
])
def test_commit_of_a_checkout_and_its_dirty_flag(checkout, change, dirty, monkeypatch):
    monkeypatch.delenv(rf.COMMIT_VARIABLE, raising=False)
    if change:
        (checkout / change).write_text("two\n")
    assert rf.commit(checkout) == {"commit": _git(checkout, "rev-parse", "HEAD"), "dirty": dirty}


@pytest.mark.parametrize("variable, expected", [
    (None, "unknown"),
    ("0123abc", "0123abc"),
])
def test_commit_of_a_copy_without_git(tmp_path, monkeypatch, variable, expected):
    copy = tmp_path / "copy"
    copy.mkdir()
    if variable is None:
        monkeypatch.delenv(rf.COMMIT_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(rf.COMMIT_VARIABLE, variable)
    assert rf.commit(copy) == {"commit": expected, "dirty": None}


@needs_git
def test_a_named_commit_outranks_a_stale_git(checkout, monkeypatch):
    """A copy of the tree shipped with an old ``.git``: the commit it names is the truth."""
    monkeypatch.setenv(rf.COMMIT_VARIABLE, "0123abc")
    assert rf.commit(checkout) == {"commit": "0123abc", "dirty": None}


@needs_git
def test_a_copy_inside_another_checkout_does_not_take_its_commit(checkout, monkeypatch):
    """The tree's copy on another machine may sit in some repository: only a ``.git`` of the
    tree's own root counts."""
    inner = checkout / "copy_of_the_tree"
    inner.mkdir()
    monkeypatch.delenv(rf.COMMIT_VARIABLE, raising=False)
    assert rf.commit(inner) == {"commit": "unknown", "dirty": None}


def test_the_result_keeps_its_own_machine_and_adds_to_the_versions():
    out = rf.stamped({"machine": "NVIDIA H200", "versions": {"cudnn": 91900}, "rows": []})
    assert out["machine"] == "NVIDIA H200"
    assert out["versions"]["cudnn"] == 91900
    assert out["versions"]["python"] == platform.python_version()
    assert out["rows"] == []


@pytest.mark.parametrize("field", ["commit", "dirty"])
def test_a_result_may_not_bring_its_own_commit(field):
    with pytest.raises(ValueError, match="records `commit` and `dirty`"):
        rf.stamped({field: "abc"})


def test_write_json_and_stamp_file_keep_the_fields_of_the_result(tmp_path):
    path = tmp_path / "sub" / "attention_2026-01-01T0000.json"
    rf.write_json(path, {"date": "2026-01-01", "decode": [{"us": 9.5}]})
    first = json.loads(path.read_text())
    assert first["decode"] == [{"us": 9.5}] and "commit" in first
    # A JSON written by another program (xgr export's report) is stamped in place.
    report = tmp_path / "export.json"
    report.write_text(json.dumps({"package_seconds": 226.0}))
    rf.stamp_file(report)
    stamped = json.loads(report.read_text())
    assert stamped["package_seconds"] == 226.0
    assert {"commit", "dirty", "machine", "versions"} <= set(stamped)
