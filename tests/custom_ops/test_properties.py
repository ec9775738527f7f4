"""Hostile-input properties of the feature ops, run in a child interpreter.

The properties live in ``fuzz_feature_ops.py`` (hypothesis, deterministic examples). A C++
crash would kill the child; the test asserts it exited with 0 and reports its output.
"""

import subprocess
from pathlib import Path

import pytest

# Heavy (hostile inputs in child processes): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

SCRIPT = Path(__file__).with_name("fuzz_feature_ops.py")


def test_ops_survive_hostile_input(python, subprocess_env):
    env = dict(subprocess_env, XGR_FUZZ_EXAMPLES="40")
    proc = subprocess.run([python, str(SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=300)
    report = proc.stdout + proc.stderr[-4000:]
    assert proc.returncode == 0, f"child exited with {proc.returncode}:\n{report}"
    for name in ("clean_sequence_is_safe", "semantic_id_lookup_is_safe", "table_init_is_safe",
                 "catalog_file_is_safe", "assemble_prompt_is_safe"):
        assert f"ok {name}:" in proc.stdout, report
