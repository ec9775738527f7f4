"""Example (c) end to end: export the pipeline, serve it, query it over gRPC and REST.

The example itself checks both answers against the SavedModel called in process (ids exact,
floats within the tolerance table) and exits non-zero otherwise. The AOTInductor compile of the
engine (minutes on 2 cores) is cached in build/serving_example_cache across runs.
"""

import os
import re
import subprocess
import sys

import pytest

from tests.child_env import child_env

# Heavy (exports a SavedModel, starts a server): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_export_serve_query_example(tmp_path):
    env = child_env(TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "export_serve_query.py"),
         f"--workdir={tmp_path}", "--users=3"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "gRPC and REST agree with the in-process SavedModel" in done.stdout
    rows = re.findall(r"^\s+(\d+)\s+\[([\d, ]*)\]\s+(-?[\d.]+|-inf)$", done.stdout, re.M)
    assert len(rows) == 3, done.stdout
    assert all(items for _, items, _ in rows), "every user should get at least one item"
    # Step 4: each user again, excluding what it was shown, over gRPC and REST (the example
    # itself checks that nothing shown came back and that the lists stay full).
    assert "excluding what it was shown (none came back, lists full)" in done.stdout
    after = re.findall(r"^\s+(\d+)\s+\[([\d, ]*)\]$", done.stdout, re.M)
    assert len(after) == 3 and all(len(items.split(",")) == 5 for _, items in after)
    assert os.path.exists(tmp_path / "models" / "recs" / "1" / "saved_model.pb")
