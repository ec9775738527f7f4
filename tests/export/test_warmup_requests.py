"""The export's warm-up requests: the probe requests cut into requests of 1, 2 and 4 rows with
their ragged histories re-based, written as TF Serving's TFRecord of ``PredictionLog``, and
read back as a server reads them (``tf_frontend.serving.warmup``'s decoder)."""

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from tf_frontend.serving.signature import RaggedGroup, SignatureInfo, TensorInfo
from tf_frontend.serving.tensor_proto import decode_inputs
from tf_frontend.serving.validation import prepare
from xgr_common.errors import ExportError
from xgr_common.prompt_spec import PromptSpec
from xgr_common.serving_names import SERVING_SIGNATURE, WARMUP_FILE
from xgr_export.probe_requests import probe_features
from xgr_export.warmup_requests import (WARMUP_ROWS, batch_buckets, longest_row_requests,
                                        split_requests, write_warmup_requests)

_vec = lambda name, dtype: TensorInfo(name, dtype, (None,))  # noqa: E731
FEATURE_SIGNATURE = SignatureInfo(
    name=SERVING_SIGNATURE,
    inputs={"user_id": _vec("user_id", tf.int64), "country": _vec("country", tf.string),
            "history_items": _vec("history_items", tf.int64),
            "history_times": _vec("history_times", tf.int64),
            "history_splits": _vec("history_splits", tf.int64),
            "request_time": _vec("request_time", tf.int64)},
    outputs={}, input_groups=(RaggedGroup("history_splits", ("history_items", "history_times")),),
    output_groups=(), max_history_events=4096)


@pytest.fixture(scope="module")
def probes():
    return probe_features(np.arange(100, 160, dtype=np.int64), PromptSpec(), count=8, seed=3)


def test_probe_requests_are_cut_into_small_requests_with_their_own_histories(probes):
    requests = split_requests(probes)
    assert [len(r["user_id"]) for r in requests] == list(WARMUP_ROWS)
    splits = probes["history_splits"].numpy()
    items = probes["history_items"].numpy()
    start = 0
    for request, rows in zip(requests, WARMUP_ROWS):
        lo, hi = splits[start], splits[start + rows]
        np.testing.assert_array_equal(request["history_splits"], splits[start:start + rows + 1] - lo)
        np.testing.assert_array_equal(request["history_items"], items[lo:hi])
        np.testing.assert_array_equal(request["user_id"], probes["user_id"].numpy()[start:start + rows])
        start += rows
    # Sizes the batch cannot fill are left out; a bad size or group is refused.
    assert [len(r["user_id"]) for r in split_requests(probes, (4, 8))] == [4]
    with pytest.raises(ExportError, match="positive ints"):
        split_requests(probes, (0,))
    with pytest.raises(ExportError, match="ragged group 'lengths'"):
        split_requests(probes, ragged={"lengths": ("history_items",)})


def test_the_file_is_tf_servings_and_a_server_accepts_every_request(probes, tmp_path):
    path = write_warmup_requests(tmp_path, split_requests(probes))
    assert path == tmp_path / WARMUP_FILE
    records = list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())
    assert len(records) == len(WARMUP_ROWS)
    for record, rows in zip(records, WARMUP_ROWS):
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(record)
        request = log.predict_log.request
        assert log.WhichOneof("log_type") == "predict_log"
        assert request.model_spec.signature_name == SERVING_SIGNATURE
        prepared = prepare(FEATURE_SIGNATURE, decode_inputs(FEATURE_SIGNATURE, request.inputs,
                                                            1 << 22))
        assert prepared.rows == rows
    with pytest.raises(ExportError, match="at least one request"):
        write_warmup_requests(tmp_path / "empty", [])


def test_each_batch_bucket_gets_a_request_of_the_longest_row(probes):
    """One request per pow2 batch bucket up to the package's largest batch, each that many
    copies of the probe row with the longest history."""
    assert batch_buckets(16) == [1, 2, 4, 8, 16] and batch_buckets(12) == [1, 2, 4, 8, 12]
    assert batch_buckets(None) == [] and batch_buckets(1) == [1]
    splits = probes["history_splits"].numpy()
    items = probes["history_items"].numpy()
    row = int(np.argmax(np.diff(splits)))
    events = items[splits[row]:splits[row + 1]]
    requests = longest_row_requests(probes, [1, 4])
    assert [len(r["user_id"]) for r in requests] == [1, 4]
    four = requests[1]
    np.testing.assert_array_equal(four["history_splits"], np.arange(5) * len(events))
    np.testing.assert_array_equal(four["history_items"], np.tile(events, 4))
    np.testing.assert_array_equal(four["user_id"], [probes["user_id"].numpy()[row]] * 4)
    assert len(four["history_times"]) == 4 * len(events)
    with pytest.raises(ExportError, match="positive ints"):
        longest_row_requests(probes, [0])


def test_a_gpu_package_warms_every_batch_bucket_a_cached_one_twice(probes):
    """A package on a GPU gets the longest-row request of each batch bucket after the probe
    requests; with a prompt cache every row is keyed and those requests go twice (misses,
    then hits of the same users); a CPU package gets the probe requests only."""
    from pathlib import Path

    from tf_frontend.pipeline_spec import USER_KEY
    from xgr_export.saved_model import warmup_requests_for
    from xgr_export.torch_package import Package, TensorSpec

    def package(device):
        return Package(Path(), "aoti", device, (TensorSpec("int32", ("B", 64)),),
                       (TensorSpec("int64", ("B", 6)),), (("B", 1, 4),))
    probe_rows = [len(r["user_id"]) for r in split_requests(probes)]
    cpu = warmup_requests_for(package("cpu"), False, probes)
    assert [len(r["user_id"]) for r in cpu] == probe_rows
    gpu = warmup_requests_for(package("cuda:0"), False, probes)
    assert [len(r["user_id"]) for r in gpu] == probe_rows + [1, 2, 4]
    cached = warmup_requests_for(package("cuda:0"), True, probes)
    assert [len(r["user_id"]) for r in cached] == probe_rows + [1, 2, 4] * 2
    assert all(len(r[USER_KEY]) == len(r["user_id"]) for r in cached)
    long_keys = [tuple(r[USER_KEY]) for r in cached[len(probe_rows):]]
    assert long_keys[:3] == long_keys[3:] and len({k for ks in long_keys for k in ks}) == 7
