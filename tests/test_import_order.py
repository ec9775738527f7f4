"""TF and Triton in one process: our packages import triton first, the wrong order is an error,
and the SavedModel reload child needs TensorFlow and ``custom_ops`` alone."""

import subprocess
import sys
from pathlib import Path

import pytest

# Heavy (fresh interpreters for each import order): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin",
                                            "TRITON_INTERPRET": "1"})


@pytest.mark.parametrize("package", ["custom_ops", "tf_frontend", "bridge", "xgr_world",
                                     "xgr_export"])
def test_our_tf_packages_preload_triton_so_kernels_import_later(package):
    done = _run(f"import {package}, tensorflow, torch_engine.kernels; print('imported')")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "imported" in done.stdout


def test_tensorflow_first_then_kernels_is_a_clear_error_not_an_abort():
    done = _run("import tensorflow\n"
                "from xgr_common.errors import XgrError\n"
                "try:\n    import torch_engine.kernels\n"
                "except XgrError as err:\n    print('refused:', err)\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "triton must be imported before tensorflow" in done.stdout


def test_the_reload_child_loads_no_torch_and_no_tf_side_python():
    """``python -m xgr_export.run_saved_model`` imports ``xgr_export`` first: the package's
    heavy modules must stay unloaded, or a serving host would need torch."""
    done = _run("import sys, xgr_export.run_saved_model\n"
                "from xgr_export.verify import FORBIDDEN_PACKAGES\n"
                "print(sorted({m.split('.')[0] for m in sys.modules} & set(FORBIDDEN_PACKAGES)),"
                " 'tensorflow' in sys.modules, 'custom_ops' in sys.modules)\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "True", "True"]
