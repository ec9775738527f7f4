"""gRPC API of the real server, driven with tensorflow-serving-api's stubs."""

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2,
                                     model_service_pb2_grpc, predict_pb2,
                                     prediction_service_pb2_grpc)

from tests.serving.conftest import MAX_ROWS
from tests.serving.helpers import random_request


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as ch:
        yield ch


def predict_request(request: dict, model="recs", version=None, signature="") -> predict_pb2.PredictRequest:
    proto = predict_pb2.PredictRequest()
    proto.model_spec.name = model
    proto.model_spec.signature_name = signature
    if version is not None:
        proto.model_spec.version.value = version
    for name, array in request.items():
        proto.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    return proto


def test_predict_equals_in_process(channel, in_process):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = random_request(np.random.default_rng(5), rows=3)
    response = stub.Predict(predict_request(request, version=1), timeout=60)
    assert response.model_spec.name == "recs" and response.model_spec.version.value == 1
    assert response.model_spec.signature_name == "serving_default"
    expected = in_process(request)
    assert sorted(response.outputs) == sorted(expected)
    for name, array in expected.items():
        np.testing.assert_array_equal(tf.make_ndarray(response.outputs[name]), array)


def test_output_filter(channel, in_process):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = random_request(np.random.default_rng(6), rows=2)
    proto = predict_request(request)
    proto.output_filter.append("score")
    response = stub.Predict(proto, timeout=60)
    assert list(response.outputs) == ["score"]
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["score"]),
                                  in_process(request)["score"])


def test_metadata_and_status(channel):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "recs"
    request.metadata_field.append("signature_def")
    response = stub.GetModelMetadata(request, timeout=60)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(signatures)
    assert sorted(signatures.signature_def) == ["dense", "serving_default", "total"]
    assert signatures.signature_def["dense"].inputs["x"].dtype == tf.float32.as_datatype_enum

    status_stub = model_service_pb2_grpc.ModelServiceStub(channel)
    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "recs"
    status = status_stub.GetModelStatus(status_request, timeout=60)
    assert [(v.version, v.state) for v in status.model_version_status] == [
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]
    status_request.model_spec.name = "other"
    with pytest.raises(grpc.RpcError) as failure:
        status_stub.GetModelStatus(status_request, timeout=60)
    assert failure.value.code() == grpc.StatusCode.NOT_FOUND and "'other'" in failure.value.details()


def _bad_requests():
    good = random_request(np.random.default_rng(7), rows=2)
    wrong_dtype = dict(good, user_id=good["user_id"].astype(np.int32))
    missing = {k: v for k, v in good.items() if k != "country"}
    negative = dict(good, history_items=-np.ones_like(good["history_items"]))
    labelled = predict_request(good)
    labelled.model_spec.version_label = "stable"
    return {
        "version_label": (labelled, grpc.StatusCode.INVALID_ARGUMENT, "version labels"),
        "wrong_dtype": (predict_request(wrong_dtype), grpc.StatusCode.INVALID_ARGUMENT, "int64"),
        "missing_input": (predict_request(missing), grpc.StatusCode.INVALID_ARGUMENT, "country"),
        "model_invalid_argument": (predict_request(negative), grpc.StatusCode.INVALID_ARGUMENT,
                                   "history_items must be >= 0"),
        "unknown_model": (predict_request(good, model="x"), grpc.StatusCode.NOT_FOUND, "'x'"),
        "unknown_version": (predict_request(good, version=4), grpc.StatusCode.NOT_FOUND,
                            "version 4"),
        "unknown_signature": (predict_request(good, signature="s"),
                              grpc.StatusCode.INVALID_ARGUMENT, "'s'"),
        "oversized": (predict_request(dict(good, user_id=np.zeros(20_000, np.int64))),
                      grpc.StatusCode.RESOURCE_EXHAUSTED, ""),
        # A few bytes declaring 200M elements: refused before it is materialised.
        "amplified": (_amplified(good), grpc.StatusCode.INVALID_ARGUMENT,
                      "declares 200000000 elements"),
        "too_many_rows": (predict_request(random_request(np.random.default_rng(9),
                                                         rows=MAX_ROWS + 1)),
                          grpc.StatusCode.INVALID_ARGUMENT, f"at most {MAX_ROWS} are served"),
        # Each of these was a 500, a KeyError or a misleading message once (issue 27).
        "resource_tensor": (_replaced(good, "user_id", dtype=types_pb2.DT_RESOURCE, dims=[2]),
                            grpc.StatusCode.INVALID_ARGUMENT, "resource tensors cannot be sent"),
        "variant_tensor": (_replaced(good, "user_id", dtype=types_pb2.DT_VARIANT, dims=[2]),
                           grpc.StatusCode.INVALID_ARGUMENT, "variant tensors cannot be sent"),
        "three_values_for_shape_2": (_replaced(good, "user_id", dims=[2], int64_val=[1, 2, 3]),
                                     grpc.StatusCode.INVALID_ARGUMENT,
                                     "3 value(s) in int64_val for shape [2]"),
        "tensor_content_too_short": (_replaced(good, "user_id", dims=[2],
                                               tensor_content=b"\0" * 7),
                                     grpc.StatusCode.INVALID_ARGUMENT,
                                     "tensor_content holds 7 bytes"),
        "values_in_the_wrong_field": (_replaced(good, "user_id", dims=[2],
                                                string_val=[b"a", b"b"]),
                                      grpc.StatusCode.INVALID_ARGUMENT,
                                      "carries values in ['string_val']"),
        "unknown_rank": (_replaced(good, "user_id", unknown_rank=True, int64_val=[1]),
                         grpc.StatusCode.INVALID_ARGUMENT, "must give its shape"),
        "not_a_dtype": (_replaced(good, "user_id", dtype=999, dims=[2]),
                        grpc.StatusCode.INVALID_ARGUMENT, "999 is not a TensorFlow dtype"),
        # Refused by name before it is materialised: 200M declared elements of an unknown input.
        "unknown_amplified_input": (_replaced(good, "extra", dims=[200_000_000], int64_val=[1]),
                                    grpc.StatusCode.INVALID_ARGUMENT, "unknown input(s) ['extra']"),
    }


def _replaced(good: dict, name: str, dtype=types_pb2.DT_INT64, dims=(), unknown_rank=False,
              **values) -> predict_pb2.PredictRequest:
    """``good`` as a PredictRequest with input ``name`` replaced by a hand-made TensorProto."""
    proto = predict_request(good)
    tensor = proto.inputs[name]
    tensor.Clear()
    tensor.dtype = dtype
    tensor.tensor_shape.unknown_rank = unknown_rank
    for size in dims:
        tensor.tensor_shape.dim.add().size = size
    for field, value in values.items():
        if field == "tensor_content":
            tensor.tensor_content = value
        else:
            getattr(tensor, field).extend(value)
    return proto


def _amplified(good: dict) -> predict_pb2.PredictRequest:
    proto = predict_request(good)
    tensor = proto.inputs["history_items"]
    tensor.Clear()
    tensor.dtype = tf.int64.as_datatype_enum
    tensor.tensor_shape.dim.add().size = 200_000_000
    tensor.int64_val.append(1)
    return proto


@pytest.mark.parametrize("case", sorted(_bad_requests()))
def test_bad_request_status_and_server_keeps_serving(channel, in_process, case):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    proto, code, fragment = _bad_requests()[case]
    with pytest.raises(grpc.RpcError) as failure:
        stub.Predict(proto, timeout=60)
    assert failure.value.code() == code
    assert fragment in failure.value.details(), failure.value.details()
    if code != grpc.StatusCode.RESOURCE_EXHAUSTED:   # gRPC's own refusal carries no metadata
        assert dict(failure.value.trailing_metadata())["x-request-id"]
    assert "/tmp/" not in failure.value.details() and "{{node" not in failure.value.details()
    request = random_request(np.random.default_rng(8), rows=2)
    response = stub.Predict(predict_request(request), timeout=60)
    np.testing.assert_array_equal(tf.make_ndarray(response.outputs["score"]),
                                  in_process(request)["score"])
