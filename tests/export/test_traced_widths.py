"""One engine package for several beam widths traces the Triton search with a symbolic width:
every launcher must accept it (its rules become runtime assertions, its tiles follow the
largest width) without a guard that would fix it, and a block that holds a request's beams
must hold the widest. The CUDA export's trace, run on the CPU in
a child with the Triton interpreter off (``trace_widths_child.py``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.child_env import ROOT, child_env

# Each case traces the whole CUDA export in a child: a subprocess build, so not in test-quick.
pytestmark = pytest.mark.heavy


@pytest.mark.parametrize("widths", [(16, 24, 32), (8, 16)])
def test_the_triton_search_traces_a_dynamic_width(widths):
    env = child_env()
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "export" / "trace_widths_child.py"),
                           ",".join(map(str, widths))], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    traced = json.loads(done.stdout.strip().splitlines()[-1])
    assert (traced["low"], traced["high"]) == (min(widths), max(widths))
    # The prompt length bounded too: a batch of long prompts can pass 2**31 elements of KV.
    assert traced["unbounded"] == []
    # One program sorts all beams of a request: its block must hold the widest width (a
    # block from the example width dropped the beams past it at wider widths on the GPU).
    expansions = [launch["ints"] for launch in traced["launches"]
                  if launch["kernel"] == "_expand_items_kernel"]
    assert expansions, [launch["kernel"] for launch in traced["launches"]]
    for ints in expansions:
        assert ints["BLOCK_W"] >= max(widths) and ints["BLOCK_W"] == 2 ** ints["LOG_W"], ints
