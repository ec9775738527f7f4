"""The engine package on the GPU without TensorFlow: ``export_engine`` for CUDA with plain-torch
attention, loaded in a fresh process, returns exactly the items of ``Engine.recommend`` (eager,
CUDA graphs) on full-length prompts with the history excluded.

``gpu`` test; imports no TensorFlow (it runs where TF is not installed). The export and the run
happen in child processes (``engine_package_child.py``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.child_env import child_env
from torch_engine.aoti_loading import loader_environment

HERE = Path(__file__).resolve().parent

# Heavy (an AOTInductor export in child processes): left out of `make test-quick`.
pytestmark = [pytest.mark.gpu, pytest.mark.heavy]


def _child(*args: str, timeout: int) -> None:
    # A Python process that loads CUDA packages needs the compiler's libstdc++ first
    # (torch_engine.aoti_loading explains why); without it the load crashes the child.
    env = loader_environment(child_env())
    done = subprocess.run([sys.executable, str(HERE / "engine_package_child.py"), *args],
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (args[0], done.stdout[-2000:], done.stderr[-4000:])


def test_cuda_engine_package_matches_eager_recommend(tmp_path):
    _child("export", str(tmp_path), "cuda:0", "torch", timeout=900)
    _child("run", str(tmp_path), timeout=300)
    eager, package = torch.load(tmp_path / "eager.pt"), torch.load(tmp_path / "package.pt")
    report = json.loads((tmp_path / "export.json").read_text())
    print(f"CUDA export {report['seconds']:.0f} s; package call {package['seconds'] * 1e3:.2f} ms "
          f"at batch {eager['items'].shape[0]}")
    assert report["package"]["device"] == "cuda:0"
    assert torch.equal(package["items"], eager["items"])
    torch.testing.assert_close(package["scores"], eager["scores"], rtol=1e-4, atol=1e-4)
    excluded = eager["inputs"][4]
    assert not (package["items"][:, :, None] == excluded[:, None, :]).any()
    assert (package["items"] >= 0).all()
    assert "tensorflow" not in package["modules"]
