"""SavedModels built for the serving tests, their NumPy twins, and small clients.

``HistoryModel``: the feature graph's input layout (ids, a string, a ragged history as values +
row splits, a request time) with outputs that depend on every input, a ragged output, and an
``InvalidArgument`` raised by the model on negative item ids. Its ``dense`` signature has one
float input.
"""

import json
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tf_frontend.serving.config import ServerConfig
from tf_frontend.serving.server import ModelServer
from xgr_common.serving_names import SERVING_SIGNATURE



HISTORY_SPEC = [tf.TensorSpec([None], tf.int64, name="user_id"),
                tf.TensorSpec([None], tf.string, name="country"),
                tf.TensorSpec([None], tf.int64, name="history_items"),
                tf.TensorSpec([None], tf.int64, name="history_times"),
                tf.TensorSpec([None], tf.int64, name="history_splits"),
                tf.TensorSpec([None], tf.int64, name="request_time")]
RECENT_WINDOW = 100


class HistoryModel(tf.Module):
    """score = scale * user_id + sum(items) + len(country); recent = items within the window."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = tf.Variable(scale, dtype=tf.float32)
        # The model's own history limit, which the server reads when no flag overrides it.
        self.max_history_events = tf.Variable(50, dtype=tf.int64, trainable=False)

    @tf.function(input_signature=HISTORY_SPEC)
    def serve(self, user_id, country, history_items, history_times, history_splits, request_time):
        inputs = dict(user_id=user_id, country=country, history_items=history_items,
                      history_times=history_times, history_splits=history_splits,
                      request_time=request_time)
        items = inputs["history_items"]
        tf.debugging.assert_non_negative(items, message="history_items must be >= 0")
        history = tf.RaggedTensor.from_row_splits(items, inputs["history_splits"], validate=False)
        times = tf.RaggedTensor.from_row_splits(inputs["history_times"], inputs["history_splits"],
                                                validate=False)
        recent = tf.ragged.boolean_mask(
            history, times >= tf.expand_dims(inputs["request_time"], 1) - RECENT_WINDOW)
        score = (self.scale * tf.cast(inputs["user_id"], tf.float32)
                 + tf.cast(tf.reduce_sum(history, axis=1), tf.float32)
                 + tf.cast(tf.strings.length(inputs["country"]), tf.float32))
        return {"score": score, "country_upper": tf.strings.upper(inputs["country"]),
                "recent_items": recent.flat_values, "recent_splits": recent.row_splits}


def history_reference(scale, user_id, country, history_items, history_times, history_splits,
                      request_time):
    """NumPy twin of HistoryModel for one request."""
    rows = len(user_id)
    score, recent, splits = [], [], [0]
    for r in range(rows):
        lo, hi = history_splits[r], history_splits[r + 1]
        items, times = history_items[lo:hi], history_times[lo:hi]
        score.append(scale * user_id[r] + items.sum() + len(country[r]))
        kept = items[times >= request_time[r] - RECENT_WINDOW]
        recent.extend(kept.tolist())
        splits.append(splits[-1] + len(kept))
    return {"score": np.array(score, np.float32),
            "country_upper": np.array([c.upper() for c in country], dtype=object),
            "recent_items": np.array(recent, np.int64), "recent_splits": np.array(splits, np.int64)}


def save_history_model(path: str, scale: float) -> str:
    module = HistoryModel(scale)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def dense(x):
        return {"y": tf.reduce_sum(x, axis=1) * 2.0}

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def total(x):  # a scalar output: requests cannot share a call
        return {"total": tf.reduce_sum(x), "rows": tf.shape(x)[0]}

    module.dense, module.total = dense, total
    tf.saved_model.save(module, path, signatures={
        SERVING_SIGNATURE: module.serve.get_concrete_function(),
        "dense": dense.get_concrete_function(), "total": total.get_concrete_function()})
    return path


def random_request(rng: np.random.Generator, rows: int, max_events: int = 6) -> dict:
    lengths = rng.integers(0, max_events + 1, rows)
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    request_time = rng.integers(1000, 2000, rows).astype(np.int64)
    times = np.concatenate([rng.integers(t - 300, t + 1, n) for t, n in zip(request_time, lengths)]
                           ).astype(np.int64) if splits[-1] else np.zeros(0, np.int64)
    return {"user_id": rng.integers(0, 10_000, rows).astype(np.int64),
            "country": np.array([rng.choice(["de", "fr", "usa", "jp"]).encode() for _ in range(rows)],
                                dtype=object),
            "history_items": rng.integers(0, 500, splits[-1]).astype(np.int64),
            "history_times": times, "history_splits": splits, "request_time": request_time}


def start_server(base: str, **overrides) -> ModelServer:
    config = ServerConfig(model_name="recs", model_base_path=base, port=0, rest_api_port=0,
                          bind_address="127.0.0.1", **overrides)
    server = ModelServer(config)
    server.start()
    return server


def pending_requests(server: ModelServer) -> float:
    """The server's ``xgr_serving_pending_requests`` gauge: requests admitted, not answered."""
    return server.metrics.registry.get_sample_value("xgr_serving_pending_requests",
                                                     {"model_name": "recs"})


def wait_for_pending(server: ModelServer, count: int, timeout: float = 60.0) -> None:
    """Waits until ``server`` holds ``count`` requests admitted and not yet answered: a test
    that needs requests in the queue waits for them there, not for a guessed time."""
    deadline = time.monotonic() + timeout
    while pending_requests(server) != count:
        assert time.monotonic() < deadline, \
            f"{pending_requests(server)} requests pending after {timeout} s, not {count}"
        time.sleep(0.01)


def columnar(request: dict) -> dict:
    """A request of arrays as TF Serving's columnar JSON ("inputs")."""
    return {name: [v.decode() for v in a] if a.dtype == object else a.tolist()
            for name, a in request.items()}


def instances(request: dict) -> list[dict]:
    """The same request in the row format: one object per row, histories as lists."""
    splits = request["history_splits"]
    rows = []
    for r in range(len(request["user_id"])):
        lo, hi = splits[r], splits[r + 1]
        rows.append({"user_id": int(request["user_id"][r]),
                     "country": request["country"][r].decode(),
                     "history_items": request["history_items"][lo:hi].tolist(),
                     "history_times": request["history_times"][lo:hi].tolist(),
                     "request_time": int(request["request_time"][r])})
    return rows


def http_full(port: int, path: str, body=None, method=None, raw: bytes | None = None,
              headers: dict | None = None, timeout: float = 60):
    """(status, parsed JSON or text, response headers) of one request to the REST port."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, text, got = resp.status, resp.read().decode(), resp.headers
    except urllib.error.HTTPError as e:
        status, text, got = e.code, e.read().decode(), e.headers
    try:
        return status, json.loads(text), got
    except ValueError:
        return status, text, got


def http(port: int, path: str, body=None, method=None, raw: bytes | None = None):
    """(status, parsed JSON or text) of one request to the REST port."""
    status, answer, _ = http_full(port, path, body, method, raw)
    return status, answer


def grpc_predict(port: int, inputs: dict, model: str = "recs") -> dict:
    """``PredictionService.Predict`` of ``inputs`` (name -> array) through the real stub on
    loopback; returns the outputs as NumPy arrays."""
    proto = predict_pb2.PredictRequest()
    proto.model_spec.name = model
    for name, array in inputs.items():
        proto.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(proto, timeout=60)
    return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


def write_warmup(version_dir, requests) -> str:
    """``assets.extra/tf_serving_warmup_requests`` of ``version_dir``, as an export writes it:
    one ``predict_log`` record per request (name -> array)."""
    from xgr_export.warmup_requests import write_warmup_requests

    return str(write_warmup_requests(version_dir, requests))
