"""The export's warm-up requests: ``assets.extra/tf_serving_warmup_requests`` as TF Serving
defines it, a TFRecord file of ``PredictionLog`` protos each holding one ``PredictRequest``.

A server replays them before a version goes live (``xgr serve`` and TF Serving alike). That is
the only moment a broken deploy can be caught before it serves: TorchCall loads its engine
package on the first call, so without warm-up a truncated ``assets/engine.pt2`` would load
"fine" and fail every client request. Replaying requests of a few batch sizes also compiles
and captures the engine's shape buckets for them (CUDA graphs on a GPU), so the first clients
do not pay for it.

``split_requests`` cuts a batch of feature-graph requests (the export's probe requests) into
requests of a few rows each, the ragged history re-based per request; ``write_warmup_requests``
writes them. Needs TensorFlow and the ``tensorflow-serving-api`` protos only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from xgr_common.errors import ExportError, require
from xgr_common.serving_names import SERVING_SIGNATURE, WARMUP_FILE

# The feature graph's ragged group: row splits -> the value tensors they partition.
HISTORY_GROUP = {"history_splits": ("history_items", "history_times")}
# Batch sizes of the warm-up requests: one request per size, rows taken in order.
WARMUP_ROWS = (1, 2, 4)


def _array(value) -> np.ndarray:
    return value.numpy() if isinstance(value, tf.Tensor) else np.asarray(value)


def split_requests(features: Mapping[str, object], rows_per_request: Sequence[int] = WARMUP_ROWS,
                   ragged: Mapping[str, Sequence[str]] = HISTORY_GROUP) -> list[dict[str, np.ndarray]]:
    """Requests of ``rows_per_request`` rows each, taken in order from the batch ``features``
    (name -> tensor or array; batch-major tensors [B, ...], ragged values [E, ...] with their
    row splits [B + 1]); sizes the batch cannot fill are left out."""
    arrays = {name: _array(value) for name, value in features.items()}
    for splits, values in ragged.items():
        require(splits in arrays and all(v in arrays for v in values), ExportError,
                f"warm-up requests: ragged group {splits!r} -> {list(values)} is not among the "
                f"features {sorted(arrays)}")
    first_splits = next(iter(ragged), None)
    grouped = {n for s, vs in ragged.items() for n in (s, *vs)}
    rows = (len(arrays[first_splits]) - 1 if first_splits is not None
            else len(next(iter(arrays.values()))))
    requests, start = [], 0
    for size in rows_per_request:
        require(isinstance(size, int) and size >= 1, ExportError,
                f"warm-up requests: rows per request must be positive ints, got {size!r}")
        if start + size > rows:
            break
        request = {name: array[start:start + size] for name, array in arrays.items()
                   if name not in grouped}
        for splits, values in ragged.items():
            bounds = arrays[splits][start:start + size + 1]
            lo, hi = int(bounds[0]), int(bounds[-1])
            request[splits] = (bounds - bounds[0]).astype(arrays[splits].dtype)
            for value in values:
                request[value] = arrays[value][lo:hi]
        requests.append(request)
        start += size
    return requests


def write_warmup_requests(saved_model_dir: str | os.PathLike,
                          requests: Sequence[Mapping[str, np.ndarray]],
                          signature_name: str = SERVING_SIGNATURE,
                          more: Sequence[tuple[str, Mapping[str, np.ndarray]]] = ()) -> Path:
    """Writes ``requests`` (name -> array, one dict per request) for ``signature_name``, then
    ``more`` (signature, request) pairs, as the SavedModel's warm-up file; returns its path."""
    require(len(requests) >= 1, ExportError, "warm-up requests: need at least one request")
    path = Path(saved_model_dir) / WARMUP_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for signature_name, request in [(signature_name, r) for r in requests] + list(more):
            proto = predict_pb2.PredictRequest()
            proto.model_spec.signature_name = signature_name
            for name, array in request.items():
                proto.inputs[name].CopyFrom(tf.make_tensor_proto(array))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=proto))
            writer.write(log.SerializeToString())
    return path
