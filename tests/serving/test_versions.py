"""Versions of an export-like model (a TorchCall engine package, the export's warm-up
requests) deployed, broken, repaired and removed under a real server, one poll at a time:
a version serves only once it loaded and answered its warm-up requests, a broken one never
replaces the serving one and says so everywhere an operator looks, and a model fault is a
server error (5xx / INTERNAL) with a request id, never the caller's 400."""

import logging
import os
import shutil

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.serving.engine_model import (ENGINE_FILE, FAULT, corrupt, deploy, expected_score,
                                        truncate)
from tests.serving.helpers import http, http_full, start_server

# Heavy (TorchScript engine packages, servers): left out of `make test-quick`.
pytestmark = pytest.mark.heavy

PREDICT = "/v1/models/recs:predict"
X = np.arange(8, dtype=np.float32).reshape(2, 4)


def _states(server) -> dict:
    _, body = http(server.rest_port, "/v1/models/recs")
    return {int(v["version"]): (v["state"], v["status"]["error_message"])
            for v in body["model_version_status"]}


def _rest_score(server) -> tuple[int, object]:
    status, body = http(server.rest_port, PREDICT, {"inputs": {"x": X.tolist()}})
    return status, body["outputs"] if status == 200 else body


def _grpc(server, x=X):
    proto = predict_pb2.PredictRequest()
    proto.model_spec.name = "recs"
    proto.inputs["x"].CopyFrom(tf.make_tensor_proto(x))
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response, call = stub.Predict.with_call(proto, timeout=60)
    return response, dict(call.trailing_metadata())


def _assert_serves(server, scale):
    status, score = _rest_score(server)
    assert status == 200, score
    np.testing.assert_allclose(score, expected_score(scale, X))
    response, _ = _grpc(server)
    assert response.model_spec.version.value in (1, 2, 3, 4, 5)
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["score"]), expected_score(scale, X))


@pytest.fixture
def base(tmp_path):
    folder = tmp_path / "recs"
    folder.mkdir()
    return folder


def test_a_broken_deploy_never_replaces_the_serving_version(engine_models, base, caplog):
    deploy(base, 1, engine_models[1])
    server = start_server(str(base), file_system_poll_wait_seconds=0)
    caplog.set_level(logging.INFO, logger="xgr.serving")
    try:
        assert _states(server) == {1: ("AVAILABLE", "")}
        for version, damage in ((2, truncate), (3, corrupt)):
            deploy(base, version, engine_models[2], damage)
            server.manager.poll_once()
            states = _states(server)
            assert states[1] == ("AVAILABLE", ""), states
            state, error = states[version]
            assert state == "END" and "warm-up request 0 failed" in error, error
            assert "engine.pt" in error and str(base) not in error and "/" not in error, error
            _assert_serves(server, 1)
            failures = [r for r in caplog.records if r.levelno == logging.ERROR
                        and getattr(r, "version", None) == version]
            assert failures and failures[0].getMessage().startswith("model version failed to load")
            assert str(base) in failures[0].error   # the log keeps the detail
        status, health = http(server.rest_port, "/healthz")
        assert status == 200 and health["status"] == "SERVING" and health["serving_version"] == 1
        assert [f["version"] for f in health["failed_versions"]] == [2, 3]

        # A good version after the broken ones is picked up: they do not block it.
        deploy(base, 4, engine_models[4])
        server.manager.poll_once()
        assert _states(server)[4] == ("AVAILABLE", "") and _states(server)[1][0] == "END"
        _assert_serves(server, 4)
        assert http(server.rest_port, "/healthz") == (200, {"status": "SERVING"})

        # Its folder removed: the newest version that loads (1; 3 and 2 failed) takes over.
        shutil.rmtree(base / "4")
        server.manager.poll_once()
        states = _states(server)
        assert states[1] == ("AVAILABLE", "") and states[4] == ("END", ""), states
        _assert_serves(server, 1)
        # Failed versions removed from disk stop being reported.
        shutil.rmtree(base / "2")
        shutil.rmtree(base / "3")
        server.manager.poll_once()
        assert set(_states(server)) == {1, 4}
    finally:
        server.stop()


def test_without_a_loadable_version_the_model_is_unavailable_until_repaired(engine_models, base):
    deploy(base, 1, engine_models[2], truncate)
    server = start_server(str(base), file_system_poll_wait_seconds=0)
    try:
        status, health = http(server.rest_port, "/healthz")
        assert status == 503 and health["status"] == "NOT_SERVING"
        assert health["failed_versions"][0]["version"] == 1
        status, body = http(server.rest_port, PREDICT, {"inputs": {"x": X.tolist()}})
        assert status == 503 and "failed to load" in body["error"], body
        with pytest.raises(grpc.RpcError) as failure:
            _grpc(server)
        assert failure.value.code() == grpc.StatusCode.UNAVAILABLE
        # The engine file repaired in place: its files changed, so the version is retried.
        shutil.copyfile(engine_models[2] / ENGINE_FILE, base / "1" / ENGINE_FILE)
        server.manager.poll_once()
        assert _states(server) == {1: ("AVAILABLE", "")}
        _assert_serves(server, 2)
    finally:
        server.stop()


def test_a_model_fault_is_a_500_with_a_request_id_and_no_internals(engine_models, base, caplog):
    deploy(base, 1, engine_models[1])
    server = start_server(str(base), file_system_poll_wait_seconds=0)
    caplog.set_level(logging.INFO, logger="xgr.serving")
    marked = X.copy()
    marked[1, 0] = FAULT
    try:
        status, body, headers = http_full(server.rest_port, PREDICT,
                                          {"inputs": {"x": marked.tolist()}})
        assert status == 500, body
        request_id = headers["X-Request-Id"]
        assert body["request_id"] == request_id and request_id in body["error"]
        for internal in ("/", "node", "TorchCall", "__inference", "engine fault"):
            assert internal not in body["error"], body
        logged = [r for r in caplog.records if getattr(r, "request_id", None) == request_id]
        assert logged and logged[0].levelno == logging.ERROR
        assert "engine fault on a marked row" in logged[0].error
        with pytest.raises(grpc.RpcError) as failure:
            _grpc(server, marked)
        assert failure.value.code() == grpc.StatusCode.INTERNAL
        trailing = dict(failure.value.trailing_metadata())
        assert trailing["x-request-id"] in failure.value.details()
        assert "/" not in failure.value.details() and "TorchCall" not in failure.value.details()
        _assert_serves(server, 1)   # the fault was this request's only
    finally:
        server.stop()


def test_an_offered_request_id_is_kept_and_every_answer_carries_one(engine_models, base):
    deploy(base, 1, engine_models[1])
    server = start_server(str(base), file_system_poll_wait_seconds=0)
    try:
        status, _, headers = http_full(server.rest_port, PREDICT, {"inputs": {"x": X.tolist()}},
                                       headers={"X-Request-Id": "client-7.a"})
        assert status == 200 and headers["X-Request-Id"] == "client-7.a"
        status, _, headers = http_full(server.rest_port, PREDICT, {"inputs": {"x": X.tolist()}},
                                       headers={"X-Request-Id": "no spaces allowed\u00e9"})
        assert status == 200 and len(headers["X-Request-Id"]) == 16
        for path in ("/healthz", "/v1/models/recs", "/v1/models/nope", "/monitoring/prometheus/metrics"):
            assert http_full(server.rest_port, path)[2]["X-Request-Id"]
        _, trailing = _grpc(server)
        assert len(trailing["x-request-id"]) == 16
    finally:
        server.stop()
        assert not os.path.exists(base / ".staging-1")
