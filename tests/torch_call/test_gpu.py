"""TorchCall on a GPU host: TF tensors stay on the CPU, the package runs on CUDA, results come
back to TF; a package naming a GPU the host lacks is refused without ending the process.

``gpu`` tests (``make test-gpu``): the packages are compiled for CUDA in a child process
(``build_packages.py OUT CACHE cuda``)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tensorflow as tf
import torch

from custom_ops.torch_call import torch_call
from xgr_common.tolerances import tolerance_for

pytestmark = pytest.mark.gpu
OUT = [tf.float32, tf.int64]


def _inputs(seed: int, batch: int = 5, length: int = 3):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((batch, 4)).astype(np.float32),
            rng.integers(-50, 50, (batch, length)).astype(np.int64))


def _check(got, x, ids, two_heads):
    with torch.no_grad():
        want_x, want_ids = two_heads(torch.from_numpy(x), torch.from_numpy(ids))
    tol = tolerance_for(np.float32)
    np.testing.assert_allclose(got[0].numpy(), want_x.numpy(), rtol=tol.rtol, atol=tol.atol)
    np.testing.assert_array_equal(got[1].numpy(), want_ids.numpy())


@pytest.mark.parametrize("name", ["two_heads_aoti", "two_heads_script"])
def test_cuda_package_on_cpu_tensors(cuda_packages, two_heads, name):
    package = cuda_packages[name]
    assert package.device == "cuda:0"
    for seed, (batch, length) in enumerate([(1, 1), (5, 3), (300, 17)]):
        x, ids = _inputs(seed, batch, length)
        got = torch_call(str(package.path), [x, ids], OUT)
        assert all("CPU" in t.device for t in got)  # results are host tensors again
        _check(got, x, ids, two_heads)


def test_cuda_package_inside_a_tf_function(cuda_packages, two_heads):
    path = str(cuda_packages["two_heads_aoti"].path)

    @tf.function
    def graph(x, ids):
        return torch_call(path, [x, ids], OUT)

    x, ids = _inputs(7, 9, 4)
    _check(graph(x, ids), x, ids, two_heads)


def test_contract_violations_still_raise_on_cuda(cuda_packages):
    path = str(cuda_packages["two_heads_aoti"].path)
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 0: expected float32"):
        torch_call(path, [np.ones((3, 4), np.float64), np.ones((3, 2), np.int64)], OUT)


def test_a_gpu_this_host_lacks_is_refused_and_the_process_goes_on(cuda_packages, two_heads):
    far = cuda_packages["far_gpu"]
    x, ids = _inputs(3)
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=rf"compiled for {far.device} but this process sees "
                             rf"{torch.cuda.device_count()} CUDA device"):
        torch_call(str(far.path), [x, ids], OUT)
    _check(torch_call(str(cuda_packages["two_heads_aoti"].path), [x, ids], OUT), x, ids,
           two_heads)


def test_concurrent_calls_on_one_cuda_package(cuda_packages, two_heads, tmp_path):
    source = cuda_packages["two_heads_aoti"].path
    path = str(tmp_path / "fresh.pt2")   # every thread races on the first load too
    shutil.copyfile(source, path)

    def worker(seed: int) -> int:
        for call in range(20):
            x, ids = _inputs(seed * 100 + call, 1 + (seed + call) % 7, 1 + call % 5)
            _check(torch_call(path, [x, ids], OUT, concurrency=2), x, ids, two_heads)
        return seed

    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(worker, range(8))) == list(range(8))


def test_a_graphed_package_replays_one_graph_per_bucket(cuda_packages, two_heads):
    """Each bucket (rows to a power of two, ids columns to a multiple of 8) is captured once
    and replayed after; results equal the eager module's; with the 4 graphs held, a fifth
    bucket runs eagerly when first seen and replaces the least often seen graph (the least
    recently used among equals) when seen again; concurrent callers are served one replay at
    a time."""
    from custom_ops.torch_call import package_stats

    path = str(cuda_packages["two_heads_graphed"].path)
    shapes = [(1, 1), (3, 5), (4, 8), (5, 3), (300, 17), (3, 2)]
    for seed, (batch, length) in enumerate(shapes):
        x, ids = _inputs(seed, batch, length)
        _check(torch_call(path, [x, ids], OUT), x, ids, two_heads)
    stats = package_stats()[path]
    assert stats["graphs"] and stats["failure"] == "" and stats["eager_runs"] == 0, stats
    # Buckets (1, 8), (4, 8), (8, 8), (512, 24); (3, 5), (4, 8) and (3, 2) share (4, 8).
    assert stats["calls"] == 6 and stats["replays"] == 6 and stats["captures"] == 4, stats
    x, ids = _inputs(99, 2000, 30)  # a fifth bucket: eager, then captured in (1, 8)'s place
    _check(torch_call(path, [x, ids], OUT), x, ids, two_heads)
    stats = package_stats()[path]
    assert stats["eager_runs"] == 1 and stats["evictions"] == 0, stats
    _check(torch_call(path, [x, ids], OUT), x, ids, two_heads)
    stats = package_stats()[path]
    assert stats["held"] == stats["budget"] == 4 and stats["evictions"] == 1, stats
    assert stats["captures"] == 5 and stats["replays"] == 7, stats
    inputs = [_inputs(100 + i, 1 + i % 5, 1 + i % 9) for i in range(32)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda a: torch_call(path, list(a), OUT), inputs))
    for (x, ids), got in zip(inputs, results):
        _check(got, x, ids, two_heads)


def test_unloading_a_graphed_package_frees_it_and_its_files(cuda_packages, tmp_path):
    import json
    import subprocess
    import sys

    from tests.child_env import child_env
    from tests.torch_call.test_package_lifetime import _CHILD

    done = subprocess.run([sys.executable, "-c", _CHILD,
                           str(cuda_packages["two_heads_graphed"].path), str(tmp_path / "m")],
                          env=child_env(TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"before": {"held": True, "library": True},
                   "after": {"held": False, "library": False}}, out
