"""Many TF threads call TorchCall at once: the first load happens once, results stay right."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf

from custom_ops.torch_call import torch_call

THREADS, CALLS = 8, 25


def _expected_ids(ids: np.ndarray) -> np.ndarray:
    return ids * 2 + ids.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("name", ["two_heads_aoti", "two_heads_script"])
def test_concurrent_calls_from_many_threads(packages, tmp_path, name):
    # A fresh copy, so every thread races on the first load of this path as well.
    source = packages[name].path
    path = str(tmp_path / f"fresh{source.suffix}")
    shutil.copyfile(source, path)

    def worker(seed: int) -> int:
        rng = np.random.default_rng(seed)
        for _ in range(CALLS):
            batch, length = int(rng.integers(1, 64)), int(rng.integers(1, 9))
            ids = rng.integers(0, 10**6, size=(batch, length), dtype=np.int64)
            x = rng.standard_normal((batch, 4)).astype(np.float32)
            y, z = torch_call(path, [x, ids], [tf.float32, tf.int64], concurrency=2)
            np.testing.assert_array_equal(z.numpy(), _expected_ids(ids))
            assert y.shape == (batch, 3)
        return CALLS

    with ThreadPoolExecutor(THREADS) as pool:
        done = sum(pool.map(worker, range(THREADS)))
    assert done == THREADS * CALLS


def test_concurrent_graph_calls_with_inter_op_parallelism(packages):
    path = str(packages["two_heads_aoti"].path)
    ids = np.arange(40, dtype=np.int64).reshape(8, 5)
    x = np.ones((8, 4), np.float32)

    @tf.function
    def fan_out():
        # Independent calls in one graph: TF may run them on several inter-op threads.
        return [torch_call(path, [x, ids + k], [tf.float32, tf.int64], concurrency=2)[1]
                for k in range(6)]

    for k, z in enumerate(fan_out()):
        np.testing.assert_array_equal(z.numpy(), _expected_ids(ids + k))
