"""TF Serving's gRPC services with the ``tensorflow-serving-api`` protos.

``PredictionService``: Predict and GetModelMetadata; ``ModelService``: GetModelStatus.
Request tensors are checked before they are materialised (``tensor_proto``); outputs cross as
``TensorProto`` through ``tf.make_tensor_proto``. The caller's deadline is honoured: a request
whose deadline passes while it waits for its batch is dropped, and a cancelled call takes its
request out of the batch queue. Errors abort the call with INVALID_ARGUMENT (the caller's
mistake), NOT_FOUND, RESOURCE_EXHAUSTED (queue full), DEADLINE_EXCEEDED, UNAVAILABLE or
INTERNAL, and every answer carries its request id in the trailing metadata (``x-request-id``;
a client may send its own in the call's metadata).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time

import grpc
import tensorflow as tf
from tensorflow_serving.apis import (model_service_pb2_grpc, predict_pb2,
                                     prediction_service_pb2_grpc)

from xgr_common.errors import ConfigError, InvalidInputError, require
from xgr_common.serving_names import USER_KEY_HEADER
from tf_frontend.serving import status_codes
from tf_frontend.serving.config import SSLConfig
from tf_frontend.serving.metadata import metadata_response, status_response
from tf_frontend.serving.metrics import ServerMetrics
from tf_frontend.serving.model_manager import ModelManager
from tf_frontend.serving.public_text import full_detail
from tf_frontend.serving.tensor_proto import decode_inputs
from tf_frontend.serving.tls import grpc_server_credentials

LOG = logging.getLogger("xgr.serving")


def _version(model_spec) -> int | None:
    require(not model_spec.version_label, InvalidInputError,
            f"version labels are not served (got {model_spec.version_label!r}); use a version number")
    return model_spec.version.value if model_spec.HasField("version") else None


def _deadline(context: grpc.ServicerContext) -> float | None:
    """The caller's deadline on ``time.monotonic``'s clock; None when it set none."""
    remaining = context.time_remaining()
    # grpc reports "no deadline" as None or as a huge number of seconds.
    if remaining is None or remaining > 1e8:
        return None
    return time.monotonic() + max(0.0, remaining)


class _Guard:
    """Runs one RPC: its request id, metrics, and every error turned into a gRPC status
    (never a crash), the detail logged under the request id."""

    def __init__(self, metrics: ServerMetrics):
        self._metrics = metrics

    def __call__(self, api: str, context: grpc.ServicerContext, work):
        started = time.perf_counter()
        offered = dict(context.invocation_metadata()).get(status_codes.REQUEST_ID_METADATA)
        request_id = status_codes.request_id(offered if isinstance(offered, str) else None)
        context.set_trailing_metadata(((status_codes.REQUEST_ID_METADATA, request_id),))
        try:
            response = work(request_id)
        except Exception as e:
            code = status_codes.grpc_code(e)
            self._metrics.observe_request(api, code.name, time.perf_counter() - started)
            log = LOG.error if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) else LOG.info
            log("request failed", extra={"api": api, "request_id": request_id,
                                         "code": code.name, "error": full_detail(e)})
            context.abort(code, status_codes.message(e, request_id))
        self._metrics.observe_request(api, "OK", time.perf_counter() - started)
        return response


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, manager: ModelManager, metrics: ServerMetrics):
        self._manager, self._guard = manager, _Guard(metrics)

    def Predict(self, request, context):  # noqa: N802 (gRPC method name)
        return self._guard("grpc_predict", context,
                           lambda request_id: self._predict(request, context))

    def _predict(self, request, context) -> predict_pb2.PredictResponse:
        deadline = _deadline(context)
        spec = request.model_spec
        with self._manager.admitted(spec.name, _version(spec)) as version:
            sig = version.signature(spec.signature_name)
            inputs = decode_inputs(sig, request.inputs, version.limits.max_tensor_elements)
            user_key = dict(context.invocation_metadata()).get(USER_KEY_HEADER)
            prepared = version.prepare(sig.name, inputs, user_key)

            def on_future(future: concurrent.futures.Future) -> None:
                # Fires when the call ends for any reason: a call cancelled (or timed out)
                # while its request is queued drops the request; a done future ignores it.
                context.add_callback(future.cancel)

            outputs = version.wait(prepared, deadline, on_future=on_future)
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
        def work(request_id):
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
        return self._guard("grpc_status", context, lambda request_id: status_response(
            self._manager.statuses(request.model_spec.name, _version(request.model_spec))))


def make_grpc_server(manager: ModelManager, metrics: ServerMetrics, address: str,
                     max_workers: int, max_request_bytes: int,
                     ssl: SSLConfig | None = None) -> tuple[grpc.Server, int]:
    """A ready (not yet started) server bound to ``address``; returns it and its port. Calls
    beyond twice ``max_workers`` waiting for a thread are refused with RESOURCE_EXHAUSTED by
    gRPC itself, so its own queue is bounded too."""
    server = grpc.server(
        concurrent.futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
        options=[("grpc.max_receive_message_length", max_request_bytes),
                 ("grpc.so_reuseport", 0)],
        maximum_concurrent_rpcs=2 * max_workers)
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
        PredictionServicer(manager, metrics), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(manager, metrics), server)
    try:
        if ssl is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, grpc_server_credentials(ssl))
    except RuntimeError as e:   # grpc's "Failed to bind": the port is taken, or not this host's
        raise ConfigError(f"cannot bind the gRPC port at {address}: {e}") from e
    require(port != 0, ConfigError, f"cannot bind the gRPC port at {address}")
    return server, port
