"""TorchCall runs a package whose contract buckets its shapes (what an engine package on CUDA
does, so that one captured graph serves every request of a bucket): inputs padded to the
bucketed shape with each input's padding value, outputs cut back to the real rows, results
equal to the unbucketed package's."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from custom_ops.torch_call import torch_call
from xgr_common.tolerances import tolerance_for

OUT = [tf.int64, tf.float32]


def _request(rng, rows: int, width: int, excluded: int):
    tokens = rng.integers(1, 1024, (rows, width), dtype=np.int32)
    lengths = rng.integers(1, width + 1, rows).astype(np.int32)
    exclude = rng.integers(-1, 40, (rows, excluded)).astype(np.int64)
    return [tokens, lengths, exclude]


@pytest.mark.parametrize("rows,width,excluded", [(1, 1, 1), (3, 5, 2), (5, 9, 3), (8, 16, 4),
                                                 (9, 17, 5)])
def test_bucketed_results_equal_unbucketed(packages, rows, width, excluded):
    rng = np.random.default_rng(rows * 100 + width)
    request = _request(rng, rows, width, excluded)
    want = torch_call(str(packages["ruled_excluder"].path), request, OUT)
    got = torch_call(str(packages["bucketed_excluder"].path), request, OUT)
    assert got[0].shape == (rows, 5) and got[1].shape == (rows, 5)
    # Same items; scores within float32's tolerance (padded rows sum in another order).
    np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())
    tol = tolerance_for("float32")
    np.testing.assert_allclose(got[1].numpy(), want[1].numpy(), atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("rows,width,ran", [(1, 1, (1, 5)), (3, 6, (4, 13)), (4, 13, (4, 13)),
                                            (5, 14, (6, 21))])
def test_the_package_runs_at_the_bucketed_shape(packages, rows, width, ran):
    # Rows to a power of two (clamped to the batch range's 6), (width + 3) up to a multiple
    # of 8 minus 3; padding entries hold 7.
    ids = np.arange(rows * width, dtype=np.int64).reshape(rows, width)
    sums, shape = torch_call(str(packages["shape_probe"].path), [ids], [tf.int64, tf.int64])
    assert tuple(shape.numpy()) == ran
    np.testing.assert_array_equal(sums.numpy(), ids.sum(1) + 7 * (ran[1] - width))


def test_a_contract_bucketing_a_fixed_dimension_is_refused(packages):
    path = packages["two_heads_aoti"].path.parent / "bad_bucket.pt"
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="buckets input 0 dim 0, which is not a dynamic dimension"):
        torch_call(str(path), [np.zeros(4, np.float32)], [tf.float32])


def test_package_stats_name_the_loaded_packages(packages):
    from custom_ops.torch_call import package_stats

    script = str(packages["shape_probe"].path)
    torch_call(script, [np.ones((2, 3), np.int64)], [tf.int64, tf.int64])
    aoti = str(packages["two_heads_aoti"].path)
    torch_call(aoti, [np.ones((2, 4), np.float32), np.ones((2, 3), np.int64)],
               [tf.float32, tf.int64])
    stats = package_stats()
    # Neither replays graphs on the CPU: an AOTInductor package says so, TorchScript has none.
    assert stats[aoti] == {"graphs": False}
    assert stats[script] == {}
