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
from xgr_export.warmup_requests import WARMUP_ROWS, split_requests, write_warmup_requests

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
