"""Runs a probe's package half in a fresh process, as a server loads a package.

A probe compiles an AOTInductor package in its own process, then times it in a child: the
loader needs the compiler's ``libstdc++`` preloaded (``loader_environment``), and the child
holds nothing of the compile. The child script reads three arguments (the package, the
inputs saved with ``torch.save``, the JSON it writes) and runs from the repository root.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from torch_engine.aoti_loading import loader_environment

ROOT = Path(__file__).resolve().parents[1]


def run_package_child(script: str, package: Path, inputs: dict, work: Path,
                      timeout: float) -> dict:
    """``script``'s JSON for ``package`` on ``inputs`` (saved under ``work``), or
    ``{"child_error": the end of its stderr}`` when it fails."""
    saved, out = work / "inputs.pt", work / "out.json"
    torch.save(inputs, saved)
    done = subprocess.run([sys.executable, "-c", script, str(package), str(saved), str(out)],
                          capture_output=True, text=True, env=loader_environment(),
                          timeout=timeout, cwd=ROOT)
    if done.returncode != 0:
        return {"child_error": done.stderr[-3000:]}
    return json.loads(out.read_text())
