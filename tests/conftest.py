"""Shared test set-up: the Triton interpreter on machines without a GPU, and the gpu marker."""

import os

# Must be decided before triton is first imported anywhere in the test process.
if not os.environ.get("CUDA_VISIBLE_DEVICES") == "" and os.path.exists("/dev/nvidia0"):
    pass
else:
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from torch_engine.import_order import preload_triton  # noqa: E402

# Tests import TensorFlow and Triton in one process; TF first would abort on the triton import.
preload_triton()


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; runs with `make test-gpu` on the GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
