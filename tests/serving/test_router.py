"""``xgr serve --replicas``' front, end to end on loopback: two real servers behind the
router, TF Serving clients in front. A user's requests (key in the gRPC metadata or the REST
header) land on one replica and are answered as that replica answers; when a replica stops,
its users move to the other without a failed request, and the router's health says so."""

from __future__ import annotations

import json
import time
import urllib.request

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from tests.serving.helpers import columnar, random_request, start_server
from tf_frontend.serving.affinity import AffinityConfig, ReplicaSet
from tf_frontend.serving.router import Router, replicas_from

pytestmark = pytest.mark.heavy


@pytest.fixture
def routed(model_base):
    servers = [start_server(model_base, file_system_poll_wait_seconds=0) for _ in range(2)]
    replicas = ReplicaSet(replicas_from((f"r{i}", s.grpc_port, s.rest_port)
                                        for i, s in enumerate(servers)),
                          AffinityConfig(fail_threshold=1, drain_seconds=30.0))
    router = Router(replicas, health_seconds=0.2)
    router.start()
    yield router, servers
    router.stop(1.0)
    for server in servers:
        server.stop()


def _grpc(router: Router, request: dict, key: str) -> tuple[dict, str]:
    proto = predict_pb2.PredictRequest()
    proto.model_spec.name = "recs"
    for name, array in request.items():
        proto.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    with grpc.insecure_channel(f"127.0.0.1:{router.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        answer, call = stub.Predict.with_call(proto, timeout=60,
                                              metadata=(("x-user-key", key),))
    replica = dict(call.trailing_metadata())["x-replica"]
    return {k: tf.make_ndarray(v) for k, v in answer.outputs.items()}, replica


def _rest(router: Router, request: dict, key: str) -> tuple[int, dict, str]:
    body = json.dumps({"inputs": columnar(request)}).encode()
    call = urllib.request.Request(f"http://127.0.0.1:{router.rest_port}/v1/models/recs:predict",
                                  data=body, headers={"x-user-key": key})
    with urllib.request.urlopen(call, timeout=60) as answer:
        return answer.status, json.loads(answer.read()), answer.headers["x-replica"]


def test_users_stay_on_their_replica_and_move_when_it_stops(routed, in_process):
    router, servers = routed
    rng = np.random.default_rng(0)
    keys = [f"user-{i}" for i in range(12)]
    requests = {key: random_request(rng, 2) for key in keys}
    seen = {}
    for key in keys:
        want = in_process(requests[key])
        got, replica = _grpc(router, requests[key], key)
        np.testing.assert_allclose(got["score"], want["score"], rtol=1e-6)
        status, body, by_rest = _rest(router, requests[key], key)
        assert status == 200 and by_rest == replica == router.replicas.owner(key.encode())
        seen[key] = replica
    assert set(seen.values()) == {"r0", "r1"}           # the keys spread over both
    servers[0].stop()
    for key in keys:                                      # r0's users move to r1, none fails
        got, replica = _grpc(router, requests[key], key)
        assert replica == "r1"
        np.testing.assert_allclose(got["score"], in_process(requests[key])["score"], rtol=1e-6)
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{router.rest_port}/healthz") as answer:
            health = json.loads(answer.read())
        drained = {r["name"] for r in health["replicas"] if r["drained"]}
        if drained == {"r0"} or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert drained == {"r0"} and health["status"] == "SERVING"
    with urllib.request.urlopen(
            f"http://127.0.0.1:{router.rest_port}/monitoring/prometheus/metrics") as answer:
        text = answer.read().decode()
    assert 'xgr_router_drained{replica="r0"} 1.0' in text
    assert "xgr_router_retries_total" in text


def test_a_clients_mistake_passes_through_as_its_own_answer(routed):
    router, _ = routed
    body = json.dumps({"inputs": {"user_id": [1]}}).encode()      # inputs missing
    call = urllib.request.Request(f"http://127.0.0.1:{router.rest_port}/v1/models/recs:predict",
                                  data=body, headers={"x-user-key": "u"})
    with pytest.raises(urllib.error.HTTPError) as error:
        urllib.request.urlopen(call, timeout=60)
    assert error.value.code == 400 and "missing input" in error.value.read().decode()
    assert not any(r["drained"] for r in router.replicas.snapshot())


def test_xgr_serve_replicas_routes_by_key_and_stops_cleanly(model_base, tmp_path):
    """``xgr serve --replicas 2`` as an operator starts it: two children and the front on
    one pair of ports; a user's requests always name the same replica; SIGTERM stops all."""
    import os
    import signal
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    process = subprocess.Popen(
        [sys.executable, "-m", "xgr_cli.main", "serve", "--model_name=recs",
         f"--model_base_path={model_base}", "--port=0", "--rest_api_port=0", "--replicas=2",
         "--file_system_poll_wait_seconds=0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1"))
    try:
        line = process.stdout.readline()
        assert "(2 replicas)" in line, process.stderr.read()[-3000:]
        rest_port = int(line.split("rest port ")[1].split()[0])
        request = random_request(np.random.default_rng(5), 2)
        body = json.dumps({"inputs": columnar(request)}).encode()
        replicas = set()
        for key in ("alice", "bob", "carol", "dave", "erin", "frank"):
            names = set()
            for _ in range(2):
                call = urllib.request.Request(
                    f"http://127.0.0.1:{rest_port}/v1/models/recs:predict", data=body,
                    headers={"x-user-key": key})
                with urllib.request.urlopen(call, timeout=60) as answer:
                    assert answer.status == 200
                    names.add(answer.headers["x-replica"])
            assert len(names) == 1
            replicas |= names
        assert replicas == {"r0", "r1"}
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=90) == 0
    finally:
        if process.poll() is None:
            process.kill()
