"""``torch_engine`` must import on a machine without TensorFlow (the GPU machine has none)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.child_env import child_env

# Heavy (fresh interpreters without TensorFlow): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import importlib, importlib.abc, pkgutil, sys

    class NoTensorFlow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("tensorflow", "tf_keras", "keras"):
                raise ImportError(f"{name} is not installed on this machine")
            return None

    sys.meta_path.insert(0, NoTensorFlow())
    import torch_engine
    failures = []
    names = ["torch_engine"] + [m.name for m in pkgutil.walk_packages(
        torch_engine.__path__, "torch_engine.") if not m.name.endswith(".cut")]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:
            failures.append(f"{name}: {type(error).__name__}: {error}")
    for attribute in ("Engine", "Model", "ModelConfig", "Catalog"):
        try:
            getattr(torch_engine, attribute)
        except AttributeError:
            pass  # not written yet; the module walk above covers what exists
        except Exception as error:
            failures.append(f"torch_engine.{attribute}: {type(error).__name__}: {error}")
    print("imported", len(names), "modules")
    print("\\n".join(failures) or "no failures")
    print("tensorflow loaded:", any(m.split(".")[0] == "tensorflow" for m in sys.modules))
""")


def test_torch_engine_and_its_submodules_import_without_tensorflow():
    env = child_env(TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert int(lines[0].split()[1]) >= 8, result.stdout  # the walk found the package's modules
    assert "no failures" in lines, result.stdout
    assert lines[-1] == "tensorflow loaded: False"


def test_the_blocker_really_blocks_tensorflow():
    """The control: the same finder makes ``import tensorflow`` fail."""
    code = CHILD.split("import torch_engine")[0] + "import tensorflow\n"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0 and "not installed on this machine" in result.stderr


# Hides TensorFlow as the GPU machine lacks it: the path finder reports it absent, so
# ``importlib.util.find_spec`` probes (torch makes some) answer None instead of raising.
HIDE_TF = textwrap.dedent("""
    import importlib.machinery, sys
    _PF = importlib.machinery.PathFinder
    _HIDDEN = {"tensorflow", "tensorflow_serving", "tf_keras", "keras", "tensorboard", "tf2onnx"}

    class _NoTF:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            return None if name.split(".")[0] in _HIDDEN else _PF.find_spec(name, path, target)

        invalidate_caches = staticmethod(_PF.invalidate_caches)
        find_distributions = staticmethod(_PF.find_distributions)

    sys.meta_path[:] = [_NoTF if f is _PF else f for f in sys.meta_path]
""")


def test_gpu_tests_collect_without_tensorflow(tmp_path):
    """``make test-gpu`` on the GPU machine: modules that need TF are skipped, not errors, and
    the kernel, engine, engine-package and large-pool GPU tests are collected."""
    (tmp_path / "sitecustomize.py").write_text(HIDE_TF)
    env = child_env(tmp_path, TRITON_INTERPRET="1")
    control = subprocess.run([sys.executable, "-c", "import tensorflow"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert control.returncode != 0 and "No module named 'tensorflow'" in control.stderr
    done = subprocess.run([sys.executable, "-m", "pytest", "tests", "-m", "gpu",
                           "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    assert "ERROR" not in done.stdout and "TensorFlow is not installed here" in done.stdout
    for module in ("tests/kernels/test_decode_attention.py",
                   "tests/torch_engine/test_engine_cuda.py",
                   "tests/torch_call/test_gpu_engine_package.py",
                   "tests/torch_engine/test_prompt_cache.py",
                   "tests/export/test_gpu_large_pool.py"):
        assert module in done.stdout, done.stdout[-3000:]
