"""TorchCall test packages, built once per session in a child process (``build_packages.py``;
Triton cannot be imported into this process once TF is loaded). AOTInductor packages are kept
across runs in ``build/torch_call_cache``, keyed by a hash of the graph and weights."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.child_env import child_env
from xgr_export.torch_package import Package

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CACHE = ROOT / "build" / "torch_call_cache"


def _load_builder():
    spec = importlib.util.spec_from_file_location("torch_call_build_packages",
                                                  HERE / "build_packages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_packages(out: Path, device: str = "cpu") -> dict[str, Package]:
    """Runs the builder in a child and returns its packages by name (``device``: the CPU set
    or the GPU set, see ``build_packages.py``)."""
    env = child_env(TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, str(HERE / "build_packages.py"), str(out),
                           str(CACHE), device], env=env, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"building test packages failed:\n{done.stderr[-4000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    refusals = manifest.pop("refusals")
    packages = {name: Package.from_json(data) for name, data in manifest.items()}
    packages["refusals"] = refusals
    return packages


@pytest.fixture(scope="session")
def builder():
    """The module that defines the test models (for torch references)."""
    return _load_builder()


@pytest.fixture(scope="session")
def packages(tmp_path_factory):
    return build_packages(tmp_path_factory.mktemp("packages"))


@pytest.fixture(scope="session")
def cuda_packages(tmp_path_factory):
    """The GPU set (``gpu`` tests only: compiling for CUDA needs a GPU)."""
    return build_packages(tmp_path_factory.mktemp("cuda_packages"), "cuda")


@pytest.fixture(scope="session")
def two_heads(builder):
    return builder.TwoHeads().eval()


@pytest.fixture(params=["aoti", "script"])
def package(request, packages):
    """Each test that takes ``package`` runs once per format."""
    return packages[f"two_heads_{request.param}"]
