"""Warm-up from ``assets.extra/tf_serving_warmup_requests``, as TF Serving does.

The file is a TFRecord of ``PredictionLog`` protos; each ``predict_log`` request is replayed
once against the freshly loaded version before it becomes AVAILABLE. That is what proves a
version works: TorchCall loads its engine package on the first call, so a truncated or
corrupt package is found here, and the version stays out, instead of on the first client's
request. A failing warm-up request (of any kind: a rejected input as much as a model fault)
fails the load. Its tensors are checked as a client's are (``tensor_proto``).
"""

from __future__ import annotations

import os

import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2

from xgr_common.errors import ExportError
from xgr_common.serving_names import WARMUP_FILE
from tf_frontend.serving.servable import ServableVersion
from tf_frontend.serving.tensor_proto import decode_inputs

MAX_RECORDS = 1000   # TF Serving's own bound on warm-up records


def run_warmup(version: ServableVersion) -> int:
    """Replays the version's warm-up requests; returns how many ran (0 without a file)."""
    path = os.path.join(version.path, WARMUP_FILE)
    if not os.path.exists(path):
        return 0
    count = 0
    try:
        records = list(tf.data.TFRecordDataset(path).take(MAX_RECORDS + 1).as_numpy_iterator())
    except tf.errors.OpError as e:
        raise ExportError(f"{WARMUP_FILE}: not a readable TFRecord file: {e.message}") from e
    if len(records) > MAX_RECORDS:
        raise ExportError(f"{WARMUP_FILE}: more than {MAX_RECORDS} records")
    for record in records:
        log = prediction_log_pb2.PredictionLog()
        try:
            log.ParseFromString(record)
        except Exception as e:  # protobuf's DecodeError has no stable public base class
            raise ExportError(f"{WARMUP_FILE}: record {count} is not a PredictionLog") from e
        kind = log.WhichOneof("log_type")
        if kind != "predict_log":
            raise ExportError(f"{WARMUP_FILE}: record {count} is a {kind}; only predict_log "
                              "is served")
        request = log.predict_log.request
        try:
            sig = version.signature(request.model_spec.signature_name)
            inputs = decode_inputs(sig, request.inputs, version.limits.max_tensor_elements)
            version.predict(sig.name, inputs, batched=False)
        except Exception as e:
            raise ExportError(f"warm-up request {count} failed: {type(e).__name__}: {e}") from e
        count += 1
    return count
