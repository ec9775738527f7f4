"""Warm-up from ``assets.extra/tf_serving_warmup_requests``, as TF Serving does.

The file is a TFRecord of ``PredictionLog`` protos; each ``predict_log`` request is replayed
once against the freshly loaded version before it becomes AVAILABLE, so the first real request
does not pay for tracing and lazy initialisation. A failing warm-up request fails the load.
"""

from __future__ import annotations

import os

import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from xgr_common.errors import ExportError, XgrError
from tf_frontend.serving.servable import ServableVersion

WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")


def run_warmup(version: ServableVersion) -> int:
    """Replays the version's warm-up requests; returns how many ran (0 without a file)."""
    path = os.path.join(version.path, WARMUP_FILE)
    if not os.path.exists(path):
        return 0
    count = 0
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        log = prediction_log_pb2.PredictionLog()
        log.ParseFromString(record)
        kind = log.WhichOneof("log_type")
        if kind != "predict_log":
            raise ExportError(f"{path}: record {count} is a {kind}; only predict_log is served")
        request = log.predict_log.request
        inputs = {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}
        try:
            version.predict(request.model_spec.signature_name, inputs, batched=False)
        except XgrError as e:
            raise ExportError(f"{path}: warm-up request {count} failed: {e}") from e
        count += 1
    return count
