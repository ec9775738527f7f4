"""Loading the op libraries: paths, the missing-library error and a torch-free import."""

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.child_env import child_env
from xgr_common.errors import OpLibraryError

# Heavy (fresh interpreters loading the op libraries): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]


def test_library_paths_point_at_built_files(ops):
    paths = ops.library_paths()
    assert "feature_ops" in paths and paths["feature_ops"].exists()
    assert paths["feature_ops"].name.startswith("_feature_ops.")
    assert ops.library_path("custom_ops._feature_ops") == paths["feature_ops"]
    assert ops.load_library("_feature_ops") is ops.load_library("feature_ops")


def test_unknown_library_is_named(ops):
    with pytest.raises(OpLibraryError, match="unknown op library 'nope'.*feature_ops"):
        ops.load_library("nope")


IMPORT_CHILD = textwrap.dedent("""
    import sys
    try:
        import custom_ops
    except Exception as err:
        print(type(err).__name__, err)
        sys.exit(3)
    print("torch" in sys.modules)
""")


def test_import_loads_libraries_without_torch(python, subprocess_env):
    proc = subprocess.run([python, "-c", IMPORT_CHILD], env=subprocess_env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"


def test_unbuilt_library_names_file_and_command(tmp_path, python):
    """A copy of the package with its sources but no built library, first on the path."""
    shutil.copytree(REPO / "custom_ops", tmp_path / "custom_ops",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    env = child_env(tmp_path, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([python, "-c", IMPORT_CHILD], env=env, capture_output=True,
                          text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    message = proc.stdout
    assert message.startswith("OpLibraryError")
    assert str(tmp_path / "custom_ops" / "_feature_ops.") in message
    assert "is not built" in message and "pip install --no-build-isolation -e ." in message
    assert "make install" in message
