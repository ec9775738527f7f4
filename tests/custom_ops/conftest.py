"""Fixtures for the custom-op tests: the op package, its Torch twins and a small world."""

import os
import sys

import numpy as np
import pytest

from tests.child_env import child_env

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session")
def ops():
    import custom_ops
    return custom_ops


@pytest.fixture(scope="session")
def twins():
    from custom_ops import torch_twins
    return torch_twins


@pytest.fixture(scope="session")
def world():
    from xgr_world.synthetic import WorldConfig, make_world
    return make_world(WorldConfig(num_items=600, num_users=64, history_events=30, seed=3))


@pytest.fixture()
def subprocess_env():
    """Environment for child interpreters: the repository importable, TF quiet."""
    return child_env(TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="session")
def python():
    return sys.executable


def as_numpy(outputs):
    """A tuple of TF or torch tensors as NumPy arrays."""
    return tuple(np.asarray(o.numpy() if hasattr(o, "numpy") else o) for o in outputs)
