"""TF Serving's gRPC services with the ``tensorflow-serving-api`` protos.

``PredictionService``: Predict and GetModelMetadata; ``ModelService``: GetModelStatus.
Tensors cross as ``TensorProto`` through ``tf.make_ndarray`` / ``tf.make_tensor_proto``; the
input dtype must be the signature's (as in TF Serving). Errors abort the call with
INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE or INTERNAL and the project's message.
"""

from __future__ import annotations

import concurrent.futures
import time

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import (model_service_pb2_grpc, predict_pb2,
                                     prediction_service_pb2_grpc)

from xgr_common.errors import InvalidInputError, require
from tf_frontend.serving import status_codes
from tf_frontend.serving.metadata import metadata_response, status_response
from tf_frontend.serving.metrics import ServerMetrics
from tf_frontend.serving.model_manager import ModelManager


def _version(model_spec) -> int | None:
    require(not model_spec.version_label, InvalidInputError,
            f"version labels are not served (got {model_spec.version_label!r}); use a version number")
    return model_spec.version.value if model_spec.HasField("version") else None


def _to_array(name: str, proto, max_elements: int) -> np.ndarray:
    """The input's array; its declared size is checked first, since ``make_ndarray`` fills a
    declared shape from a single value (a few bytes can ask for gigabytes)."""
    dims = [d.size for d in proto.tensor_shape.dim]
    require(all(size >= 0 for size in dims), InvalidInputError,
            f"input {name!r}: TensorProto declares negative dimensions {dims}")
    declared = 1
    for size in dims:
        declared *= size
    require(declared <= max_elements, InvalidInputError,
            f"input {name!r}: TensorProto declares {declared} elements (shape {dims}); at most "
            f"{max_elements} are accepted per input (--max_tensor_elements)")
    try:
        return tf.make_ndarray(proto)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"input {name!r}: malformed TensorProto: {e}") from e


class _Guard:
    """Runs one RPC: metrics, and every error turned into a gRPC status (never a crash)."""

    def __init__(self, metrics: ServerMetrics):
        self._metrics = metrics

    def __call__(self, api: str, context: grpc.ServicerContext, work):
        started = time.perf_counter()
        try:
            response = work()
        except Exception as e:
            code = status_codes.grpc_code(e)
            self._metrics.observe_request(api, code.name, time.perf_counter() - started)
            context.abort(code, status_codes.message(e))
        self._metrics.observe_request(api, "OK", time.perf_counter() - started)
        return response


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, manager: ModelManager, metrics: ServerMetrics,
                 max_tensor_elements: int = 1 << 22):
        self._manager, self._guard = manager, _Guard(metrics)
        self._max_elements = max_tensor_elements

    def Predict(self, request, context):  # noqa: N802 (gRPC method name)
        return self._guard("grpc_predict", context, lambda: self._predict(request))

    def _predict(self, request) -> predict_pb2.PredictResponse:
        version = self._manager.get(request.model_spec.name, _version(request.model_spec))
        inputs = {name: _to_array(name, proto, self._max_elements)
                  for name, proto in request.inputs.items()}
        sig, outputs = version.predict(request.model_spec.signature_name, inputs)
        wanted = list(request.output_filter) or list(outputs)
        unknown = sorted(set(wanted) - set(outputs))
        require(not unknown, InvalidInputError,
                f"output_filter names unknown output(s) {unknown}; outputs: {sorted(outputs)}")
        response = predict_pb2.PredictResponse()
        response.model_spec.name = version.model_name
        response.model_spec.version.value = version.version
        response.model_spec.signature_name = sig.name
        for name in wanted:
            response.outputs[name].CopyFrom(
                tf.make_tensor_proto(outputs[name], dtype=sig.outputs[name].dtype))
        return response

    def GetModelMetadata(self, request, context):  # noqa: N802
        def work():
            fields = list(request.metadata_field)
            require(fields == ["signature_def"], InvalidInputError,
                    f"metadata_field must be ['signature_def'], got {fields}")
            return metadata_response(self._manager.get(request.model_spec.name,
                                                       _version(request.model_spec)))
        return self._guard("grpc_metadata", context, work)


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, manager: ModelManager, metrics: ServerMetrics):
        self._manager, self._guard = manager, _Guard(metrics)

    def GetModelStatus(self, request, context):  # noqa: N802
        return self._guard("grpc_status", context, lambda: status_response(
            self._manager.statuses(request.model_spec.name, _version(request.model_spec))))


def make_grpc_server(manager: ModelManager, metrics: ServerMetrics, address: str,
                     max_workers: int, max_request_bytes: int,
                     max_tensor_elements: int = 1 << 22) -> tuple[grpc.Server, int]:
    """A started-ready (not yet started) server bound to ``address``; returns it and its port."""
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        options=[("grpc.max_receive_message_length", max_request_bytes),
                 ("grpc.so_reuseport", 0)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionServicer(manager, metrics, max_tensor_elements), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(manager, metrics), server)
    port = server.add_insecure_port(address)
    require(port != 0, InvalidInputError, f"cannot bind the gRPC port at {address}")
    return server, port
