"""The Gluon decode probe (``experiments/probe_gluon_decode.py``) compiles for sm_90 here, with
no GPU, and keeps its registers: the kernel that ``docs/notes/attention.md`` v14 timed stays
buildable. Its numbers need a Hopper GPU; Gluon kernels do not run under Triton's interpreter.

Not part of ``make test`` (which collects ``tests/`` only): ``python -m pytest experiments/tests``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.child_env import ROOT, child_env
from tests.sm90_compile import assert_no_spills


def test_gluon_probe_compiles_for_sm90_without_spills():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: run the probe itself")
    env = child_env(TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run(
        [sys.executable, "-m", "experiments.probe_gluon_decode", "--compile_only",
         "--variants=overlap_s3_n64,plain_s3_n64"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if "No module named 'triton.backends.nvidia" in done.stderr:
        pytest.skip("this Triton has no CUDA backend")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("COMPILED")]
    # Two variants at head dims 64 and 128.
    assert len(lines) == 4, done.stdout
    assert_no_spills(lines)
    # The asynchronous order holds fewer registers than four programs per multiprocessor allow.
    d64_overlap = next(line for line in lines if line.startswith("COMPILED d64 overlap"))
    registers = int(d64_overlap.split("REG:")[1].split()[0])
    assert registers <= 128, d64_overlap


def test_gluon_probe_refuses_an_unknown_variant():
    env = child_env(TRITON_INTERPRET="0")
    done = subprocess.run(
        [sys.executable, "-m", "experiments.probe_gluon_decode", "--compile_only",
         "--variants=overlap_s9_n64"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode != 0
    assert "--variants: unknown ['overlap_s9_n64']" in done.stderr + done.stdout
