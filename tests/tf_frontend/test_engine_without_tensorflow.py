"""``torch_engine`` must import on a machine without TensorFlow (the GPU machine has none)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, TRITON_INTERPRET="1")
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
