"""Import order between TensorFlow and Triton, which both carry their own copy of LLVM.

Importing ``triton`` after ``tensorflow`` aborts the whole process (``LLVM ERROR:
inconsistency in registered CommandLine options``); the other order works. Every package of ours that imports TensorFlow calls ``preload_triton`` first, and the
Triton kernels call ``check_triton_importable`` so the wrong order gives an error, not an abort.

Imports neither TF nor torch.
"""

from __future__ import annotations

import importlib.util
import sys

from xgr_common.errors import XgrError


def preload_triton() -> None:
    """Import triton (if installed) before TensorFlow is imported; a no-op otherwise."""
    if "triton" in sys.modules or "tensorflow" in sys.modules:
        return
    if importlib.util.find_spec("triton") is not None:
        importlib.import_module("triton")  # loading it is the point


def triton_importable() -> bool:
    """Whether code that imports triton (the kernels, torch.export, Inductor, torch's
    optimisers) is safe in this process: triton is loaded, absent, or TF is not loaded yet."""
    preload_triton()
    return ("triton" in sys.modules or "tensorflow" not in sys.modules
            or importlib.util.find_spec("triton") is None)


def check_triton_importable() -> None:
    """Raise instead of letting a triton import after TensorFlow abort the process."""
    if not triton_importable():
        raise XgrError(
            "triton must be imported before tensorflow in one process (both carry LLVM; the "
            "other order aborts the process). Import `triton`, `bridge`, `tf_frontend` or "
            "`custom_ops` before `import tensorflow`.")
