"""Batching: concurrent clients share model calls and each receives exactly its own rows."""

import concurrent.futures
import threading

import numpy as np
import pytest

from tests.serving.helpers import columnar, grpc_predict, http, random_request

CLIENTS = 12


def _batches_and_rows(server) -> tuple[float, float]:
    registry, labels = server.metrics.registry, {"model_name": "recs"}
    return (registry.get_sample_value("xgr_serving_batch_size_count", labels) or 0.0,
            registry.get_sample_value("xgr_serving_batch_size_sum", labels) or 0.0)


def _rest_predict(port: int, request: dict) -> tuple[int, dict]:
    return http(port, "/v1/models/recs:predict", {"inputs": columnar(request)})


def test_concurrent_clients_coalesce_and_get_their_own_results(server, in_process):
    rng = np.random.default_rng(11)
    requests = [random_request(rng, rows=int(rng.integers(1, 4))) for _ in range(CLIENTS)]
    batches_before, rows_before = _batches_and_rows(server)
    start = threading.Barrier(CLIENTS)

    def client(i: int):
        start.wait()
        if i % 2:
            return grpc_predict(server.grpc_port, requests[i])
        status, body = _rest_predict(server.rest_port, requests[i])
        assert status == 200, body
        return body["outputs"]

    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(client, range(CLIENTS)))
    for request, answer in zip(requests, answers):
        expected = in_process(request)
        np.testing.assert_array_equal(np.asarray(answer["score"], np.float32), expected["score"])
        np.testing.assert_array_equal(np.asarray(answer["recent_items"], np.int64).reshape(-1),
                                      expected["recent_items"])
        np.testing.assert_array_equal(np.asarray(answer["recent_splits"], np.int64),
                                      expected["recent_splits"])
    batches, rows = _batches_and_rows(server)
    assert rows - rows_before == sum(len(r["user_id"]) for r in requests)
    assert batches - batches_before < CLIENTS, "no two requests shared a model call"


def _sample(server, name: str, **labels) -> float:
    return server.metrics.registry.get_sample_value(
        name, {"model_name": "recs", **labels}) or 0.0


def _latency_sum(server) -> float:
    """The request latency histogram's sum over every API."""
    return sum(sample.value for family in server.metrics.registry.collect()
               for sample in family.samples
               if sample.name == "xgr_serving_request_latency_seconds_sum")


def test_model_call_time_is_counted_per_call_and_within_its_requests_latency(server):
    rng = np.random.default_rng(13)
    requests = [random_request(rng, rows=2) for _ in range(6)]
    before = {name: _sample(server, name) for name in (
        "xgr_serving_model_call_seconds_count", "xgr_serving_model_call_seconds_sum",
        "xgr_serving_batch_size_count")}
    waited = _latency_sum(server)
    start = threading.Barrier(len(requests))

    def client(i: int):
        start.wait()
        return _rest_predict(server.rest_port, requests[i])

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        assert all(status == 200 for status, _ in pool.map(client, range(len(requests))))
    calls = _sample(server, "xgr_serving_model_call_seconds_count") - before[
        "xgr_serving_model_call_seconds_count"]
    busy = _sample(server, "xgr_serving_model_call_seconds_sum") - before[
        "xgr_serving_model_call_seconds_sum"]
    waited = _latency_sum(server) - waited
    # One sample per model call, as the batch-size histogram has; a request waits at least
    # for the call that answers it, so the calls' time is within the requests' latency.
    assert calls == _sample(server, "xgr_serving_batch_size_count") - before[
        "xgr_serving_batch_size_count"]
    assert 1 <= calls <= len(requests)
    assert 0 < busy <= waited


def test_one_failing_request_does_not_fail_its_batch(server, in_process):
    rng = np.random.default_rng(12)
    requests = [random_request(rng, rows=2, max_events=3) for _ in range(6)]
    bad = 3
    requests[bad]["history_items"] = -np.ones(3, np.int64)
    requests[bad]["history_times"] = np.zeros(3, np.int64)
    requests[bad]["history_splits"] = np.array([0, 1, 3], np.int64)
    start = threading.Barrier(len(requests))

    def client(i: int):
        start.wait()
        return _rest_predict(server.rest_port, requests[i])

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(client, range(len(requests))))
    for i, (status, body) in enumerate(answers):
        if i == bad:
            assert status == 400 and "history_items must be >= 0" in body["error"]
        else:
            assert status == 200, body
            np.testing.assert_array_equal(np.asarray(body["outputs"]["score"], np.float32),
                                          in_process(requests[i])["score"])


def test_a_signature_with_a_scalar_output_runs_each_request_alone(server):
    version = server.manager.get("recs", None)
    assert version.signatures["serving_default"].batchable
    assert not version.signatures["total"].batchable
    rng = np.random.default_rng(13)
    inputs = [rng.normal(size=(int(rng.integers(1, 4)), 3)).astype(np.float32) for _ in range(6)]
    start = threading.Barrier(len(inputs))

    def client(i: int):
        start.wait()
        return http(server.rest_port, "/v1/models/recs:predict",
                    {"signature_name": "total", "inputs": inputs[i].tolist()})

    with concurrent.futures.ThreadPoolExecutor(len(inputs)) as pool:
        answers = list(pool.map(client, range(len(inputs))))
    for x, (status, body) in zip(inputs, answers):
        assert status == 200, body
        assert body["outputs"]["rows"] == len(x)
        assert body["outputs"]["total"] == pytest.approx(float(x.sum()), rel=1e-5)
