"""What an error body keeps of a TF message (the rule, not the graph), and which scratch
folders a starting server removes (only those of processes that are gone)."""

import os
import subprocess
import sys

from tf_frontend.serving.public_text import public_text
from tf_frontend.serving.scratch import (PREFIX, claim_scratch_folder, process_start_time,
                                         remove_stale)

# A real message of the history model's assertion (tests/serving/helpers.py), as TF words it.
ASSERTION = (
    "Graph execution error:\n\nDetected at node assert_non_negative/assert_less_equal/Assert/"
    "AssertGuard/Assert defined at (most recent call last):\n<stack traces unavailable>\n"
    "assertion failed: [history_items must be >= 0.  ] [Condition x >= 0 did not hold "
    "element-wise:] [x (history_items:0) = ] [-1 -1 -1...]\n\t [[{{node assert_non_negative/"
    "assert_less_equal/Assert/AssertGuard/Assert}}]] [Op:__inference_signature_wrapper_3462]")


def test_public_text_keeps_the_rule_and_drops_graph_internals_and_paths():
    text = public_text(ASSERTION)
    assert text.startswith("assertion failed: [history_items must be >= 0.")
    for internal in ("node", "AssertGuard", "__inference", "Op:", "history_items:0", "Graph"):
        assert internal not in text, text
    loading = public_text("TorchCall: cannot load package '/models/recs/2/assets/engine.pt2': "
                          "zip error in /usr/lib/x/libtorch.so")
    assert loading == "TorchCall: cannot load package 'engine.pt2': zip error in libtorch.so"
    # The caller's own URL is not a server path.
    assert public_text("no such endpoint: POST /v1/models/recs:explode").endswith(
        "/v1/models/recs:explode")
    assert len(public_text("x" * 10_000)) < 2100


def test_only_the_scratch_folders_of_gone_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(dead.stdout)
    mine = f"{PREFIX}{os.getpid()}-{process_start_time(os.getpid())}"
    folders = {
        "alive": tmp_path / mine,
        "dead": tmp_path / f"{PREFIX}{dead_pid}-12345",
        # This process's pid with another start time: an earlier process that had the pid.
        "pid_reused": tmp_path / f"{PREFIX}{os.getpid()}-1",
        "not_ours": tmp_path / "xgr-serve-notes",
    }
    for folder in folders.values():
        (folder / "aotinductor_model").mkdir(parents=True)
    removed = remove_stale(tmp_path)
    assert sorted(removed) == sorted([folders["dead"], folders["pid_reused"]])
    assert folders["alive"].exists() and folders["not_ours"].exists()


def test_claiming_makes_the_folder_the_temporary_directory(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setenv("TMPDIR", os.environ.get("TMPDIR", "/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    folder, removed = claim_scratch_folder(tmp_path)
    assert removed == [] and folder.parent == tmp_path and folder.name.startswith(PREFIX)
    assert os.environ["TMPDIR"] == str(folder) and tempfile.gettempdir() == str(folder)
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
