"""TF and Triton in one process: our packages import triton first, the wrong order is an error."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"TF_CPP_MIN_LOG_LEVEL": "3", "PATH": "/usr/bin:/bin",
                                            "TRITON_INTERPRET": "1"})


def test_our_tf_packages_preload_triton_so_kernels_import_later():
    done = _run("import custom_ops, tensorflow, torch_engine.kernels; print('imported')")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "imported" in done.stdout


def test_tensorflow_first_then_kernels_is_a_clear_error_not_an_abort():
    done = _run("import tensorflow\n"
                "from xgr_common.errors import XgrError\n"
                "try:\n    import torch_engine.kernels\n"
                "except XgrError as err:\n    print('refused:', err)\n")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "triton must be imported before tensorflow" in done.stdout
