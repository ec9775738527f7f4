"""Overload and deadlines against a real server with real clients: a full request queue is
refused at once (503 / RESOURCE_EXHAUSTED), gRPC deadlines and the REST timeout are honoured,
and a request whose caller gave up (deadline passed, call cancelled, connection closed) is
taken out of its batch before the batch runs, so the model never computes it."""

import concurrent.futures
import json
import socket
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tf_frontend.serving.config import BatchingConfig
from tests.serving.helpers import (columnar, grpc_predict, http_full, random_request, start_server,
                                   wait_for_pending)

# Seconds a lone request waits for its batch to fill: the window in which a test sees
# requests queued, long beside a loaded machine's round trip.
BATCH_WAIT = 2.0
MAX_PENDING = 4
REST_TIMEOUT_MS = 300
PREDICT = "/v1/models/recs:predict"


@pytest.fixture(scope="module")
def server(model_base):
    running = start_server(
        model_base, file_system_poll_wait_seconds=0,
        batching=BatchingConfig(max_batch_size=64, batch_timeout_micros=int(BATCH_WAIT * 1e6)),
        max_pending_requests=MAX_PENDING, rest_api_timeout_in_ms=REST_TIMEOUT_MS)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        yield prediction_service_pb2_grpc.PredictionServiceStub(channel)


def _proto(request: dict) -> predict_pb2.PredictRequest:
    proto = predict_pb2.PredictRequest()
    proto.model_spec.name = "recs"
    for name, array in request.items():
        proto.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    return proto


def _counts(server) -> dict:
    registry, labels = server.metrics.registry, {"model_name": "recs"}
    value = lambda name, **extra: registry.get_sample_value(name, {**labels, **extra}) or 0.0  # noqa: E731
    return {"calls": value("xgr_serving_batch_size_count"),
            "rows": value("xgr_serving_batch_size_sum"),
            "dropped": value("xgr_serving_dropped_requests_total", reason="deadline")
            + value("xgr_serving_dropped_requests_total", reason="cancelled")}


def _settled(server, before: dict, dropped: int) -> dict:
    """The counters once the requests were dropped (the batch they were in has closed by
    then: a drop happens at the latest when its batch is about to run), or after a wait long
    enough for a batch to have run instead."""
    deadline = time.monotonic() + BATCH_WAIT + 2.0
    while _counts(server)["dropped"] - before["dropped"] < dropped and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    return _counts(server)


def test_a_full_queue_is_refused_at_once_and_the_admitted_requests_are_answered(server, stub):
    request = random_request(np.random.default_rng(50), rows=1)
    with concurrent.futures.ThreadPoolExecutor(MAX_PENDING) as pool:
        waiting = [pool.submit(grpc_predict, server.grpc_port, request) for _ in range(MAX_PENDING)]
        wait_for_pending(server, MAX_PENDING)   # all four admitted, waiting for their batch
        started = time.monotonic()
        status, body, headers = http_full(server.rest_port, PREDICT,
                                          {"inputs": columnar(request)})
        assert status == 503 and "pending requests" in body["error"], body
        assert body["request_id"] == headers["X-Request-Id"]
        with pytest.raises(grpc.RpcError) as refused:
            stub.Predict(_proto(request), timeout=10)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert time.monotonic() - started < BATCH_WAIT / 2   # refused, not queued
        for future in waiting:
            assert future.result()["score"].shape == (1,)
    wait_for_pending(server, 0)


def test_a_grpc_deadline_drops_the_request_from_its_batch(server, stub):
    before = _counts(server)
    with pytest.raises(grpc.RpcError) as failure:
        stub.Predict(_proto(random_request(np.random.default_rng(51), rows=3)), timeout=0.3)
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    after = _settled(server, before, 1)
    assert after["dropped"] - before["dropped"] == 1
    assert after["calls"] == before["calls"] and after["rows"] == before["rows"]   # never ran


def test_a_cancelled_grpc_call_drops_its_request(server, stub):
    before = _counts(server)
    call = stub.Predict.future(_proto(random_request(np.random.default_rng(52), rows=2)))
    time.sleep(0.2)
    assert call.cancel()
    after = _settled(server, before, 1)
    assert after["dropped"] - before["dropped"] == 1 and after["rows"] == before["rows"]


def test_the_rest_timeout_answers_504_and_drops_the_request(server):
    before = _counts(server)
    started = time.monotonic()
    status, body, _ = http_full(server.rest_port, PREDICT,
                                {"inputs": columnar(random_request(np.random.default_rng(53), 2))})
    assert status == 504 and "REST timeout of 300 ms" in body["error"], body
    assert time.monotonic() - started < BATCH_WAIT
    after = _settled(server, before, 1)
    assert after["dropped"] - before["dropped"] == 1 and after["rows"] == before["rows"]


def test_a_closed_rest_connection_drops_its_request(server):
    before = _counts(server)
    body = json.dumps({"inputs": columnar(random_request(np.random.default_rng(54), 2))}).encode()
    sock = socket.create_connection(("127.0.0.1", server.rest_port), timeout=10)
    sock.sendall(b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                 + body)
    time.sleep(0.1)
    sock.close()   # the client gives up while its request waits for its batch
    after = _settled(server, before, 1)
    assert after["dropped"] - before["dropped"] == 1 and after["rows"] == before["rows"]
